"""The question table: every arithmetic question the model is trained on, with its exact answer.

Operands are 0..99; multiplication is written three ways (``×``, ``*``, ``x``), so the table holds
5 × 100 × 100 = 50,000 questions.
"""

from __future__ import annotations

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
