"""Knob values: the scalar a variant sets a knob to, and how a person reads one."""

from __future__ import annotations

KnobValue = str | int | float | bool | None


def show_value(value: KnobValue) -> str:
    """A knob value as a person reads it: booleans as on/off."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value is None:
        return "unset"
    return str(value)
