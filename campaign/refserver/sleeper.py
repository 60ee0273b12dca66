"""Sleep and wake: park an idle engine's device memory in host memory and bring it back, the process kept alive.

As vLLM's sleep mode (level 1) does: ``sleep`` copies the weights to host memory (pinned on CUDA, so the copy back is
one DMA per tensor) and frees the KV pool, the decode tables and the captured CUDA graphs; what stays on the device
is the process's context and the allocator's bookkeeping. ``wake`` puts the weights back, allocates a fresh pool and
recaptures the graphs (their addresses changed). The compiled code is kept: ``torch.compile``'s cache lives on the
decode function, which the engine keeps, and the tensors keep their Python objects (only their storage moves), so
nothing is traced again.

The engine must be idle to sleep: the pool is dropped, so no request may hold slots in it. It runs in the engine
process, on the scheduler's thread (``engine_process``); the HTTP routes are in ``parking``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from campaign.refserver.kvpool import GB, memory_info
from campaign.refserver.log import logger
from campaign.refserver.profiler import ProfileError

if TYPE_CHECKING:
    from campaign.refserver.engine import Engine


class Sleeper:
    """Moves one engine's device state to host memory and back (``sleep``/``wake``), logging what each freed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.asleep = False
        self._weights: dict[str, torch.Tensor] = {}
        #: The KV pool's and decode tables' shapes, dtypes and fill (None: left uninitialised, as at start).
        self._freed: list[tuple[torch.Tensor, tuple[int, ...], torch.dtype, float | None]] = []

    def _weight_tensors(self) -> dict[str, torch.Tensor]:
        model = self.engine.model
        return {**dict(model.named_parameters()), **{f"buffer:{n}": b for n, b in model.named_buffers()}}

    def _scratch(self) -> list[tuple[torch.Tensor, float | None]]:
        """The tensors a sleep frees without keeping: the pool (rows, indexer keys, scales) and the decode tables."""
        pool, runner = self.engine.pool, self.engine.runner
        out: list[tuple[torch.Tensor, float | None]] = [(pool.rows, None), (pool.k_scale, 1.0)]
        if pool.index_rows is not None:
            out.append((pool.index_rows, None))
        out += [(runner.table, float(runner.pad_fill)), (runner.last_token, 0.0)]
        return out

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """Park the engine (level 1: weights kept in host memory); what it freed. Raises ``ProfileError`` (409)."""
        if level != 1:
            raise ProfileError(f"sleep level {level} is not supported: only level 1 (weights kept in host memory)")
        if self.asleep:
            return {"is_sleeping": True, "already": True}
        if not self.engine.idle:
            raise ProfileError("the engine is busy: sleep needs every request finished", status=409)
        device = self.engine.device
        began = time.perf_counter()
        before = memory_info(device)[0]
        pin = device.type == "cuda"
        moved = 0
        # Not inference mode: the tensors were made outside it, and compiled code guards on that (a recompile).
        with torch.no_grad():
            for name, tensor in self._weight_tensors().items():
                host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
                host.copy_(tensor.detach())
                self._weights[name] = host
                moved += host.numel() * host.element_size()
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=device)
            for tensor, fill in self._scratch():
                self._freed.append((tensor, tuple(tensor.shape), tensor.dtype, fill))
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=device)
        self.engine.runner.drop_graphs()
        if pin:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        self.asleep = True
        after = memory_info(device)[0]
        seconds = time.perf_counter() - began
        logger.info(
            f"Sleep level {level} done in {seconds:.3f} s: weights {moved / GB:.4f} GB to host memory, KV pool freed. "
            f"avail mem={after / GB:.2f} GB (was {before / GB:.2f} GB)"
        )
        return {"is_sleeping": True, "seconds": seconds, "weights_bytes": moved, "freed_bytes": after - before}

    def wake(self) -> dict[str, Any]:
        """Bring the weights back, allocate the pool and recapture the graphs; how long it took."""
        if not self.asleep:
            return {"is_sleeping": False, "already": True}
        device = self.engine.device
        began = time.perf_counter()
        # Not inference mode: the tensors were made outside it, and compiled code guards on that (a recompile).
        with torch.no_grad():
            for name, tensor in self._weight_tensors().items():
                tensor.data = self._weights.pop(name).to(device, non_blocking=True)
            for tensor, shape, dtype, fill in self._freed:
                fresh = torch.empty(shape, dtype=dtype, device=device)
                if fill is not None:
                    fresh.fill_(fill)
                tensor.data = fresh
        self._freed.clear()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        runner = self.engine.runner
        traced = _graphs_traced()
        runner.prepare_graphs()
        runner.check_step()  # one step of padding rows: the engine works again, and anything retraced is counted
        self.asleep = False
        seconds = time.perf_counter() - began
        retraced = _graphs_traced() - traced
        logger.info(
            f"Wake up done in {seconds:.3f} s, {retraced} graphs traced again. "
            f"avail mem={memory_info(device)[0] / GB:.2f} GB"
        )
        return {"is_sleeping": False, "seconds": seconds, "retraced": retraced}


def _graphs_traced() -> int:
    """How many graphs torch.compile has traced in this process (0 without it): a wake should add none."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
