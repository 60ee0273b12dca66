"""Variants: a named set of knob values, args and env; the baseline every variant starts from."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from campaign.config.fields import MAX_VARIANT_NAME, Strict, env_names
from campaign.records import KnobValue


class VariantConfig(Strict):
    """A named set of knob values, plus raw args and env appended to the recipe's rendering."""

    name: str
    knobs: dict[str, KnobValue] = Field(default_factory=dict)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._=,+~-]*", v) or len(v) > MAX_VARIANT_NAME:
            raise ValueError(f"use letters, digits and . _ = , + ~ - (up to {MAX_VARIANT_NAME}: it names folders)")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return env_names(v)

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_strings(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [a if isinstance(a, str) else str(a) for a in v]
        return v


class BaselineConfig(VariantConfig):
    """The baseline: every variant starts from its knobs, args and env."""

    name: str = "baseline"
