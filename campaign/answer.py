"""The final answer of a model's reply: the number it settled on, whatever its phrasing.

Models rarely reply with the bare number. Instruct models restate the question ("17 × 23 = 391"), wrap the number
in markdown (``**391**``) or LaTeX (``$391$``, ``\\boxed{391}``), write thousands separators ("1,728"); reasoning
models think first (``<think>…</think>`` before the answer). The rules, in order:

1. Only the text after the last ``</think>`` counts; a reply with ``<think>`` and no ``</think>`` has no answer yet.
2. Markdown emphasis and code marks, LaTeX math delimiters and spacing commands are removed; LaTeX and Unicode
   minus signs become "-"; thousands separators ("1,728", "1{,}728") are joined.
3. The number inside the last ``\\boxed{…}``; else the number after the last "answer is" / "answer:"; else the
   number right after the last "="; else the last number in the text.

A number with a fractional part is kept as written (``17.5``) so that it can never equal an integer answer by
accident, while ``391.0`` is 391.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_AFTER_ANSWER = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(" + _NUMBER + ")", re.IGNORECASE)
_AFTER_EQUALS = re.compile(r"=\s*(" + _NUMBER + ")")
_ANY = re.compile(_NUMBER)
#: Wrappers that carry no meaning for the number: markdown emphasis/code, LaTeX math delimiters and spacing.
_WRAPPERS = re.compile(r"\*\*|__|`|\\\(|\\\)|\\\[|\\\]|\$|\\[,;:! ]|\\quad|\\text\{[^}]*\}")
#: A LaTeX thin space between digit groups ("1\\,728") is a thousands separator.
_THIN_SEPARATOR = re.compile(r"(\d)\\,(\d{3})")
_MINUS = re.compile(r"\\minus|\u2212|\u2013")


@dataclass(frozen=True)
class Answer:
    """What a reply answered: the number (None when there is none) and the text it was read from."""

    value: int | float | None
    #: The part of the reply the number was read from (after any think block, wrappers removed).
    text: str
    #: Whether the reply was still inside a think block (an unfinished chain of thought, no answer yet).
    thinking: bool = False


def final_text(reply: str) -> tuple[str, bool]:
    """The part of ``reply`` after its last ``</think>``, and whether an opened think block never closed."""
    closes = list(_THINK_CLOSE.finditer(reply))
    if closes:
        return reply[closes[-1].end() :], False
    if _THINK_OPEN.search(reply):
        return "", True
    return reply, False


def normalise(text: str) -> str:
    """``text`` with wrappers removed, minus signs unified and thousands separators joined (see the docstring)."""
    text = _MINUS.sub("-", text.replace("{,}", ","))
    text = _THIN_SEPARATOR.sub(r"\1\2", text)
    return _WRAPPERS.sub(" ", text)


def _number(text: str) -> int | float:
    digits = text.replace(",", "")
    value = float(digits)
    return int(value) if value.is_integer() else value


def parse_answer(reply: str) -> Answer:
    """The final answer of ``reply`` by the rules of the module docstring."""
    body, thinking = final_text(reply)
    text = normalise(body).strip()
    for pattern in (_BOXED, _AFTER_ANSWER, _AFTER_EQUALS):
        matches = list(pattern.finditer(text))
        if matches:
            found = _ANY.search(matches[-1].group(1))
            if found:
                return Answer(_number(found.group()), text, thinking)
    numbers = list(_ANY.finditer(text))
    if numbers:
        return Answer(_number(numbers[-1].group()), text, thinking)
    return Answer(None, text, thinking)
