"""Effective configuration: what a server says it really runs, checked against what the variant asked for.

Engines fall back quietly: vLLM turns "compile off, graphs on" into eager ("Cudagraph mode FULL_AND_PIECEWISE is not
compatible with compilation mode 0. Overriding to NONE."), SGLang picks another attention backend than the one
asked for ("Setting attention backend to triton."). A comparison between variants means nothing if the variant that
ran is not the one that was asked for. Each recipe knob may declare, as data (``effective`` in the recipe), the log
lines in which its server states the value it runs; ``verify`` reads the log up to readiness and, for every knob the
variant set, takes the last such line as the server's final word. A value that differs is ``config_not_applied``,
with that line as evidence. A knob whose server said nothing stays unverified (a note, not a failure).

Pure: it reads only its arguments (and the kind's hint from ``signatures.yaml``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from campaign.config import EffectiveRule, Recipe
from campaign.diagnose import signatures
from campaign.fingerprint import fingerprint
from campaign.records import Diagnosis, Evidence, KnobValue, show_value

KIND = "config_not_applied"
_TRUE = {"true", "on", "yes", "1", "enabled"}
_FALSE = {"false", "off", "no", "0", "none", "disabled"}


@dataclass(frozen=True)
class Stated:
    """One knob as the server stated it: asked for, said, and the line that says it (1-based)."""

    knob: str
    asked: KnobValue
    stated: KnobValue
    line: int
    text: str
    #: Earlier lines that stated the same value (a fallback warning before the final config line), oldest first.
    earlier: tuple[tuple[int, str], ...] = ()

    @property
    def applied(self) -> bool:
        """Whether the server runs what was asked."""
        return same(self.asked, self.stated)


@dataclass
class Verification:
    """What the log says about each knob the variant set."""

    stated: list[Stated] = field(default_factory=list)
    #: Knobs that declare evidence but whose server said nothing about them before readiness.
    unverified: list[str] = field(default_factory=list)

    @property
    def not_applied(self) -> list[Stated]:
        """The knobs whose value in force differs from the asked-for one."""
        return [s for s in self.stated if not s.applied]

    def diagnosis(self, server: str | None = None) -> Diagnosis | None:
        """``config_not_applied`` with the evidence lines, or None when every stated knob is in effect."""
        wrong = self.not_applied
        if not wrong:
            return None
        info = signatures().kinds.get(KIND)
        parts = [f"asked {s.knob}={show_value(s.asked)}, the server runs {show_value(s.stated)}" for s in wrong]
        first = wrong[0]
        return Diagnosis(
            kind=KIND,
            evidence=[Evidence(line=n, text=t) for s in wrong for n, t in (*s.earlier[-2:], (s.line, s.text))],
            hint=info.hint(server) if info is not None else "",
            confidence=0.95,
            fingerprint=fingerprint(KIND, [s.text for s in wrong]),
            summary="; ".join(parts) + f" (line {first.line}: {first.text.strip()[:200]})",
        )


def verify(recipe: Recipe, knobs: Mapping[str, KnobValue], lines: Sequence[tuple[int, str]]) -> Verification:
    """Check every knob in ``knobs`` that declares evidence against ``lines`` (number, text) of the log."""
    out = Verification()
    for knob, asked in knobs.items():
        rule = recipe.knobs.get(knob)
        if asked is None or rule is None or not rule.effective:
            continue
        said: list[tuple[KnobValue, int, str]] = []
        compiled = [(r, re.compile(r.pattern, re.IGNORECASE)) for r in rule.effective]
        for number, text in lines:
            for r, rx in compiled:
                m = rx.search(text)
                if m is not None:
                    value = _value(r, m)
                    if isinstance(asked, bool) and as_bool(value) is not None:
                        value = as_bool(value)  # "False", "NONE", "off": stated as the boolean they mean
                    said.append((value, number, text))
                    break
        if not said:
            out.unverified.append(knob)
            continue
        value, number, text = said[-1]
        earlier = tuple((n, t) for v, n, t in said[:-1] if same(value, v))
        out.stated.append(Stated(knob, asked, value, number, text, earlier))
    return out


def same(asked: KnobValue, stated: KnobValue) -> bool:
    """Whether a stated value is the asked one: booleans by meaning, numbers by value, names without case."""
    if isinstance(asked, bool):
        return as_bool(stated) is asked
    if isinstance(asked, int | float) and not isinstance(stated, bool):
        try:
            return float(str(stated)) == float(asked)
        except ValueError:
            return False
    return str(asked).strip().strip("'\"").lower() == str(stated).strip().strip("'\"").lower()


def as_bool(value: KnobValue) -> bool | None:
    """``value`` read as a boolean (True/False, on/off, 1/0, NONE), or None when it is not one."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().strip("'\"").lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


def _value(rule: EffectiveRule, m: re.Match[str]) -> KnobValue:
    """The value a matching line states: the ``value`` group through ``map`` (``*`` for any other), else fixed."""
    if "value" not in m.re.groupindex:
        return rule.value
    text = m.group("value")
    if text is None:
        return rule.value
    mapped = {k.lower(): v for k, v in rule.map.items()}
    key = text.strip().strip("'\"").lower()
    if key in mapped:
        return mapped[key]
    if "*" in mapped:
        return mapped["*"]
    return text
