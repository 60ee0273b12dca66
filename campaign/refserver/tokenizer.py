"""The character-level tokenizer of the arithmetic model.

Ids 0-3 are special (pad, bos, sep = "the answer starts here", eos), 4 is ``<unk>`` for any character outside the
vocabulary, then printable ASCII and ``×``. A prompt is encoded as ``bos + chars + sep``; the model answers with
digit characters and ``eos``.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD, BOS, SEP, EOS, UNK = 0, 1, 2, 3, 4
_SPECIALS = 5
_CHARS = "".join(chr(c) for c in range(32, 127)) + "×"
VOCAB_SIZE = _SPECIALS + len(_CHARS)
_ID_OF = {ch: _SPECIALS + i for i, ch in enumerate(_CHARS)}
_SPECIAL_NAMES = ("<pad>", "<bos>", "<sep>", "<eos>", "<unk>")


def encode_text(text: str) -> list[int]:
    """Ids of ``text``'s characters (``UNK`` for characters outside the vocabulary)."""
    return [_ID_OF.get(ch, UNK) for ch in text]


def encode_prompt(text: str) -> list[int]:
    """The ids the model reads before it answers: ``bos``, the text, ``sep``."""
    return [BOS, *encode_text(text), SEP]


def decode_ids(ids: Iterable[int]) -> str:
    """Text of ``ids``; special tokens (and ``UNK``) produce no text."""
    return "".join(_CHARS[i - _SPECIALS] for i in ids if i >= _SPECIALS)


def token_text(token: int) -> str:
    """How one token is shown in log-probabilities: its character, or a name such as ``<eos>`` for a special."""
    return _SPECIAL_NAMES[token] if 0 <= token < _SPECIALS else decode_ids([token])
