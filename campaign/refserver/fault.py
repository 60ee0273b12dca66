"""Fault injection: deliberately wrong attention outputs, to prove that campaign's checks catch a broken kernel.

Chosen with ``--inject-fault NAME`` (never on by default; the server logs a warning naming the fault). Each fault
wraps the decode attention output of whichever ``--attention-backend`` runs, so it behaves like a bug in that
kernel, in eager mode, under torch.compile and inside captured CUDA graphs alike. Prefill is left exact, as a
decode-kernel bug would leave it.

- ``attention-x0.7``: the output is off by a constant factor (×0.7), as a wrong softmax scale or a dropped
  normalisation term would make it. The reference model's answers survive it (its margins are wide); the
  log-probabilities of its answer tokens do not.
- ``attention-batched``: right at batch 1, wrong at batch > 1: each request reads its neighbour's attention
  output (an off-by-one row index, as a split-K merge or a padded graph bucket can get wrong).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server's --help imports this module and must not wait for torch
    import torch

FAULTS = ("attention-x0.7", "attention-batched")


def check_fault(name: str | None) -> None:
    """Raise ``ValueError`` for a name that is not one of ``FAULTS`` (None means no fault)."""
    if name is not None and name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; choose one of {', '.join(FAULTS)}")


def apply_fault(name: str | None, out: torch.Tensor) -> torch.Tensor:
    """The attention output ``out [B, H, D_v]`` as the fault ``name`` corrupts it (unchanged for None)."""
    if name == "attention-x0.7":
        return out * 0.7
    if name == "attention-batched":
        # torch.roll over the batch: row i gets row i+1's output; a batch of one is its own neighbour.
        return out.roll(shifts=-1, dims=0)
    return out
