"""FlashMLA's closeness rule for decode outputs, shared by the tests and the benchmark's spot checks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ABS_TOL = 1e-3
REL_TOL = 2.01 / 128  # about two bf16 ulps
COS_TOL = 5e-6
LSE_ABS_TOL = 1e-5
LSE_REL_TOL = 1.22e-4


@dataclass(frozen=True)
class Closeness:
    """How far an output is from its float64 reference, and whether that passes the rule."""

    bad_elements: int
    max_abs: float
    cos_diff: float
    lse_bad: int
    nonfinite: int

    @property
    def ok(self) -> bool:
        """True when every element passes, the cosine difference is small and nothing is NaN."""
        return self.bad_elements == 0 and self.cos_diff < COS_TOL and self.lse_bad == 0 and self.nonfinite == 0

    def __str__(self) -> str:
        return (
            f"bad elements {self.bad_elements}, max |err| {self.max_abs:.3g}, cosine diff {self.cos_diff:.3g}, "
            f"bad lse {self.lse_bad}, non-finite {self.nonfinite}"
        )


def compare(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor) -> Closeness:
    """Compare (out, lse) with a float64 reference: each element within 1e-3 absolute or 2.01/128 relative.

    Cosine difference is 1 − 2⟨a, r⟩ / (‖a‖² + ‖r‖²). LSE must match within 1e-5 + 1.22e-4·|ref|, with -inf
    (rows with no valid index) matched exactly.
    """
    a = out.double().cpu()
    r = ref_out.double().cpu()
    err = (a - r).abs()
    bad = ~((err < ABS_TOL) | (err <= REL_TOL * r.abs()))
    denom = (a * a).sum() + (r * r).sum()
    cos = 0.0 if denom == 0 else float(1 - 2 * (a * r).sum() / denom)
    la = lse.double().cpu()
    lr = ref_lse.double().cpu()
    both_empty = torch.isneginf(la) & torch.isneginf(lr)
    lerr = torch.where(both_empty, torch.zeros_like(la), (la - lr).abs())
    lbad = ~(lerr <= LSE_ABS_TOL + LSE_REL_TOL * torch.where(both_empty, torch.zeros_like(lr), lr.abs()))
    return Closeness(
        bad_elements=int(bad.sum()),
        max_abs=float(err.max()) if err.numel() else 0.0,
        cos_diff=cos,
        lse_bad=int(lbad.sum()),
        nonfinite=int((~torch.isfinite(a)).sum()) + int(torch.isnan(la).sum()),
    )
