"""The KV pool: one tensor of compressed KV rows per layer, sized up front, with a slot allocator.

Slots are token-granular (SGLang's ``page_size=1``) for a model that attends to every token: a request reserves
``prompt + max_new_tokens`` slots when it is admitted, so a running request never runs out of room mid-decode, and
returns them when it ends. The pool has one extra row past the last slot, the scratch row that padded batch rows
write into.

A long-context model's pool is paged (``page_size=64``, the lightning indexer's page): a request reserves whole
pages, token ``t`` of it lives at ``page[t // 64]·64 + t % 64``, and its page table is ``slots[::64] // 64``. It also
holds the indexer's key rows (``index_dim`` values per token per layer) and their per-slot scales, and one extra
page (the scratch page) so that every tensor the indexer reads holds whole pages.
"""

from __future__ import annotations

import numpy as np
import torch

GB = 1 << 30
#: SGLang's usual static fraction on a GPU when none is given.
DEFAULT_CUDA_MEM_FRACTION = 0.88
#: On a CPU host without --max-total-tokens or --mem-fraction-static: a pool that fits any laptop (a few MB).
DEFAULT_CPU_TOKENS = 65536


def memory_info(device: torch.device) -> tuple[int, int]:
    """(available, total) bytes of the device's memory: the GPU's, or this host's RAM for ``cpu``."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    fields: dict[str, int] = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024
    return fields["MemAvailable"], fields["MemTotal"]


def pool_tokens(
    device: torch.device,
    bytes_per_token: int,
    *,
    max_total_tokens: int | None,
    mem_fraction_static: float | None,
) -> int:
    """How many token slots the pool gets, the way SGLang sizes it.

    With a memory fraction F (given, or the CUDA default), the pool may use what is left of F·total after what is
    already in use: ``available - total·(1 - F)``. ``--max-total-tokens`` caps that (or sets it alone on CPU).
    Raises ``RuntimeError`` with SGLang's message when the fraction leaves no room.
    """
    fraction = mem_fraction_static
    if fraction is None and device.type == "cuda" and max_total_tokens is None:
        fraction = DEFAULT_CUDA_MEM_FRACTION
    if fraction is None:
        return max_total_tokens if max_total_tokens is not None else DEFAULT_CPU_TOKENS
    available, total = memory_info(device)
    rest = available - total * (1.0 - fraction)
    if rest <= 0:
        raise RuntimeError(
            f"Not enough memory. Please try to increase --mem-fraction-static. "
            f"(mem_fraction_static={fraction}, available={available / GB:.2f} GB, total={total / GB:.2f} GB)"
        )
    tokens = int(rest // bytes_per_token)
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return tokens


class KVPool:
    """``rows [n_layers, slots, d_qk]`` (uint8 ``[n_layers, slots, fp8_row_bytes]`` for an FP8 pool; and, paged,
    ``index_rows [n_layers, slots, index_dim]``), and a stack of free pages."""

    def __init__(
        self,
        n_layers: int,
        n_tokens: int,
        d_qk: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        page_size: int = 1,
        index_dim: int = 0,
        fp8_row_bytes: int | None = None,
    ) -> None:
        self.page_size = page_size
        self.n_pages = n_tokens // page_size
        self.n_tokens = self.n_pages * page_size
        slots = self.n_tokens + (page_size if page_size > 1 else 1)
        # Never read before a request writes it, so it is not cleared (a large GPU pool allocates instantly).
        # An FP8 pool (mla_kernels.fp8cache) holds each row as its bytes; the indexer's keys keep ``dtype``.
        if fp8_row_bytes is None:
            self.rows = torch.empty(n_layers, slots, d_qk, dtype=dtype, device=device)
        else:
            self.rows = torch.empty(n_layers, slots, fp8_row_bytes, dtype=torch.uint8, device=device)
        self.index_rows = torch.empty(n_layers, slots, index_dim, dtype=dtype, device=device) if index_dim else None
        # The indexer's per-slot key scale: an fp8 cache would need one; these keys are stored as they are.
        self.k_scale = torch.ones(slots, dtype=torch.float32, device=device)
        self._free = np.arange(self.n_pages - 1, -1, -1, dtype=np.int64)
        self._top = self.n_pages

    @property
    def scratch_slot(self) -> int:
        """The row that padded batch rows write into; no request ever reads it."""
        return self.n_tokens

    @property
    def free_slots(self) -> int:
        """Slots not reserved by any request."""
        return self._top * self.page_size

    @property
    def used_slots(self) -> int:
        """Slots reserved by requests."""
        return self.n_tokens - self.free_slots

    @property
    def nbytes(self) -> int:
        """Size of the pool's tensors."""
        index = self.index_rows.numel() * self.index_rows.element_size() if self.index_rows is not None else 0
        return self.rows.numel() * self.rows.element_size() + index

    def reserve(self, n: int) -> np.ndarray | None:
        """Take room for ``n`` tokens; returns each token's slot, or None when too few are free (the caller queues
        the request)."""
        pages = -(-n // self.page_size)
        if pages > self._top:
            return None
        taken = self._free[self._top - pages : self._top][::-1].copy()
        self._top -= pages
        if self.page_size == 1:
            return taken
        offsets = np.arange(pages * self.page_size, dtype=np.int64)
        return (taken[offsets // self.page_size] * self.page_size + offsets % self.page_size)[:n]

    def release(self, slots: np.ndarray) -> None:
        """Give back the room of ``slots`` (as ``reserve`` returned them)."""
        pages = slots[:: self.page_size] // self.page_size
        n = len(pages)
        self._free[self._top : self._top + n] = pages
        self._top += n

    def page_table(self, slots: np.ndarray) -> np.ndarray:
        """The page ids of a request's ``slots``: token t is at ``page[t // page_size]·page_size + t % page_size``."""
        return slots[:: self.page_size] // self.page_size
