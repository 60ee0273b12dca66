"""Matrices: a cartesian product of knob values expanded to variants with folder-safe names."""

from __future__ import annotations

import hashlib
import itertools
import re

from pydantic import Field, model_validator

from campaign.config.fields import Strict
from campaign.config.variant import VariantConfig
from campaign.records import KnobValue, show_value


class MatrixConfig(Strict):
    """A cartesian product of knob values; ``zip`` ties axes that move together (same length)."""

    axes: dict[str, list[KnobValue]]
    zip: list[list[str]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> MatrixConfig:
        for group in self.zip:
            missing = [a for a in group if a not in self.axes]
            if missing:
                raise ValueError(f"zip names axes that are not in axes: {missing}")
            lengths = {len(self.axes[a]) for a in group}
            if len(lengths) > 1:
                raise ValueError(f"zipped axes {group} must have the same number of values")
        for name, values in self.axes.items():
            if not values:
                raise ValueError(f"axis {name!r} has no values")
        return self


def expand_matrix(matrix: MatrixConfig, baseline: VariantConfig) -> list[VariantConfig]:
    """The variants of a matrix: the cartesian product over axes, zipped axes moving together."""
    zipped = {a for group in matrix.zip for a in group}
    dims: list[list[dict[str, KnobValue]]] = []
    for group in matrix.zip:
        n = len(matrix.axes[group[0]])
        dims.append([{a: matrix.axes[a][i] for a in group} for i in range(n)])
    for name, values in matrix.axes.items():
        if name not in zipped:
            dims.append([{name: v} for v in values])
    variants = []
    for combo in itertools.product(*dims):
        knobs: dict[str, KnobValue] = {}
        for part in combo:
            knobs.update(part)
        name = matrix_name(",".join(f"{k}={show_value(v)}" for k, v in knobs.items()))
        variants.append(VariantConfig(name=name, knobs={**baseline.knobs, **knobs}))
    return variants


def matrix_name(raw: str) -> str:
    """A folder-safe variant name for a matrix point: any value is allowed in a knob (a model path's ``/``).

    Characters a name may not hold become ``_``; when that changed anything, a short hash of the raw name keeps
    two points apart (``model_path=/a/b`` and ``model_path=_a_b`` stay different variants).
    """
    safe = re.sub(r"[^A-Za-z0-9._=,+~-]", "_", raw)
    if not safe[:1].isalnum():
        safe = "m" + safe
    if safe == raw and len(safe) <= 120:
        return safe
    digest = hashlib.sha256(raw.encode()).hexdigest()[:6]
    return f"{safe[:110]}~{digest}"
