"""The question table: every arithmetic question the model is trained on, with its exact answer.

Operands are 0..99; multiplication is written three ways (``×``, ``*``, ``x``), so the table holds
5 × 100 × 100 = 50,000 questions. A long-context question is one of them after thousands of characters of filler
words (``long_context_text``), which the long-context model is trained to ignore: its answer is the question's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

OPERATORS = ("×", "*", "x", "+", "-")


@dataclass(frozen=True)
class Question:
    """One question and the number that answers it."""

    a: int
    op: str
    b: int

    @property
    def text(self) -> str:
        """The question as a user writes it, e.g. ``What is 17×23?``."""
        return f"What is {self.a}{self.op}{self.b}?"

    @property
    def answer(self) -> int:
        """The exact answer."""
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        return self.a * self.b


def question_table() -> list[Question]:
    """All 50,000 questions, in a fixed order (operator, then A, then B)."""
    return [Question(a, op, b) for op in OPERATORS for a in range(100) for b in range(100)]


#: Words of the long-context filler: lowercase English without digits, operators or the letter x, so that nothing in
#: the filler can be read as part of a question ("AxB" is a multiplication).
_FILLER = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number "
    "no way could people my than first water been call who oil its now find long down day did get come made may "
    "part over new sound take only little work know place year live me back give most very after thing our just "
    "name good sentence man think say great where help through much before line right too mean old any same tell "
    "boy follow came want show also around form three small set put end does another well large must big even "
    "such because turn here why ask went men read need land different home us move try kind hand picture again "
    "change off play spell air away animal house point page letter mother answer found study still learn should"
)
FILLER_WORDS = tuple(_FILLER.split())


def filler_text(rng: random.Random, n_chars: int) -> str:
    """Exactly ``n_chars`` characters of filler words drawn by ``rng``, separated by spaces (the last may be cut)."""
    words: list[str] = []
    size = 0
    while size <= n_chars:  # the joined text is size - 1 characters
        word = rng.choice(FILLER_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:n_chars]


def long_context_text(question: str, filler: str) -> str:
    """A question after a context of filler (the long-context prompt): ``"<filler>. What is A×B?"``."""
    return f"{filler}. {question}" if filler else question


#: Characters a long-context prompt adds around its filler, besides the question: the ". " between them.
FILLER_JOIN = 2
