"""Where the Triton kernels run: the GPU's multiprocessor count, and the CPU interpreter check."""

from __future__ import annotations

import os

import torch

# Under TRITON_INTERPRET=1 on CPU there is no GPU to fill; a small count still makes the split path run in tests.
CPU_PROGRAM_SLOTS = 4
_SM_COUNT: dict[int, int] = {}


# Read once, when the Triton modules (which import this one first) define their kernels: that is when Triton
# itself decides between compiled and interpreted kernels. A constant also keeps torch.compile from guarding on env.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """Return whether the kernels were defined under Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRETING


def require_triton_device(t: torch.Tensor) -> None:
    """Raise ValueError when a Triton kernel cannot run on ``t``'s device (CPU needs the interpreter)."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and interpreting():
        return
    raise ValueError(
        f"the Triton backends need CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before kernels.* is "
        f"imported; got a {t.device.type} tensor"
    )


def program_slots(t: torch.Tensor) -> int:
    """Return the number of streaming multiprocessors of ``t``'s GPU (a small constant on CPU)."""
    if t.device.type != "cuda":
        return CPU_PROGRAM_SLOTS
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]
