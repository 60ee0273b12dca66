"""The decode runner: one decode step of the model, run eagerly, under torch.compile, or replayed as CUDA graphs.

As in SGLang, CUDA graphs are captured after warm-up for batch buckets 1, 2, 4, 8, ... up to ``--cuda-graph-max-bs``;
a batch is padded up to its bucket (padded rows read no slot and write the pool's scratch row) and a batch larger
than the biggest bucket runs without a graph.

What a request attends to lives on the device, as SGLang's ``req_to_token`` table does: each running request owns a
row of ``table`` (its KV slots, or with an indexer its page table), written once when it is admitted, and its last
token sits in ``last_token`` at that row. A step's input is then three numbers a request (``launch``: position, out
slot, table row): the step gathers its tokens and indices on the device and writes its greedy choice back into
``last_token``, so the next step can be launched before the host has read this one's tokens (the engine's overlap).
With a graph a step is one small host-to-device copy and one replay.

``--enable-torch-compile`` wraps the decode step in ``torch.compile`` (captured into the graphs when they are on).
Capture is attempted whenever graphs are on, whatever the device, so a CPU-only host fails at capture for the real
reason, as SGLang does; with ``--cuda-graph-fallback`` it decodes eagerly instead and logs that it does, the
silent-looking fallback real engines make (campaign's effective-config check reads the engine's line that states what
runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from campaign.refserver.kvpool import GB, KVPool, memory_info
from campaign.refserver.log import logger
from campaign.refserver.model import ArithModel, IndexPool

DecodeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class CaptureError(RuntimeError):
    """CUDA-graph capture failed; the message is SGLang's ``Capture cuda graph failed: ...``."""


def batch_buckets(max_bs: int) -> list[int]:
    """1, 2, 4, ... below ``max_bs``, then ``max_bs`` itself."""
    sizes = [1]
    while sizes[-1] * 2 < max_bs:
        sizes.append(sizes[-1] * 2)
    if max_bs > 1:
        sizes.append(max_bs)
    return sizes


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    #: The step's inputs, a row per request: position, out slot, table row (int64); the graph unpacks them.
    packed: torch.Tensor
    logits: torch.Tensor
    #: The greedy choice per row, computed inside the graph (and written to ``last_token``).
    greedy: torch.Tensor


@dataclass
class Launched:
    """A decode step queued on the device: its logits, greedy tokens and table rows (device tensors, ``[B]``)."""

    logits: torch.Tensor
    greedy: torch.Tensor
    rows: torch.Tensor


#: Columns of a step's input row: position, out slot, table row.
STEP_COLUMNS = 3


class DecodeRunner:
    """Runs ``model.decode`` for a batch; see the module docstring for the three modes."""

    def __init__(
        self,
        model: ArithModel,
        pool: KVPool,
        backend: str,
        *,
        torch_compile: bool,
        cuda_graph: bool,
        cuda_graph_max_bs: int,
        fault: str | None = None,
        cuda_graph_fallback: bool = False,
        index: IndexPool | None = None,
        index_width: int | None = None,
        max_requests: int = 1,
    ) -> None:
        self.model = model
        self.pool = pool
        self.backend = backend
        self.device = pool.rows.device
        #: Width of the decode step's last input: every slot of the request (-1 pads), or with an indexer its page
        #: table (padded rows and pages point at page 0: the indexer reads them only below a row's length).
        self.context_len = index_width or model.cfg.context_len
        self._index_pad = 0 if index is not None else -1
        self._paged = index is not None
        #: A row per running request (``set_row``) and a last one of padding, which padded batch rows use.
        self.pad_row = max_requests
        self.table = torch.full(
            (max_requests + 1, self.context_len), self._index_pad, dtype=torch.int32, device=self.device
        )
        #: Each table row's last token: the step's input, written by the prefill and by each step's choice.
        self.last_token = torch.zeros(max_requests + 1, dtype=torch.long, device=self.device)
        self._columns = torch.arange(self.context_len, device=self.device)
        self.buckets = batch_buckets(cuda_graph_max_bs)
        self.torch_compile = torch_compile
        self.cuda_graph = cuda_graph
        self.cuda_graph_fallback = cuda_graph_fallback
        self._graphs: dict[int, _Graph] = {}

        def step(tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            return model.decode(tokens, positions, pool.rows, slots, idx, backend, fault, index)

        self._step: DecodeFn = torch.compile(step) if torch_compile else step

    def prepare(self) -> None:
        """Compile (when asked) and capture the graphs (when on), logging each phase in SGLang's words.

        Raises ``CaptureError`` when capture fails.
        """
        if not self.torch_compile and not self.cuda_graph:
            # One step of padding rows, so a backend that cannot run here fails now, for its real reason.
            with torch.inference_mode():
                self._step(*self._dummy(1))
        if self.torch_compile:
            begin = time.monotonic()
            logger.info(f"Compiling the decode step with torch.compile for bs {self.buckets}. This can take a while.")
            with torch.inference_mode():
                for bs in self.buckets:
                    self._run_padded(*self._dummy(bs))
            logger.info(f"torch.compile of the decode step finished. Time elapsed: {time.monotonic() - begin:.2f} s.")
        if self.cuda_graph and self.cuda_graph_fallback and self.device.type != "cuda":
            # Asked for graphs where none can exist: run eagerly, and say so in the log.
            logger.warning(
                f"CUDA graphs are not available on device {self.device.type}; falling back to eager decode "
                "(--cuda-graph-fallback)."
            )
            self.cuda_graph = False
            with torch.inference_mode():
                self._step(*self._dummy(1))
        if self.cuda_graph:
            try:
                self._capture()
            except CaptureError as exc:
                if not self.cuda_graph_fallback:
                    raise
                logger.warning(f"{str(exc).splitlines()[0]}; falling back to eager decode (--cuda-graph-fallback).")
                self.cuda_graph = False
                self._graphs.clear()

    @property
    def pad_fill(self) -> int:
        """The value an unused table entry holds."""
        return self._index_pad

    def check_step(self) -> None:
        """Run one decode step of padding rows (they write only the scratch row), the way requests run."""
        with torch.inference_mode():
            self._run_padded(*self._dummy(1))

    def drop_graphs(self) -> None:
        """Free the captured graphs and their memory pool (a sleep: the tensors they read are about to move)."""
        self._graphs.clear()

    def prepare_graphs(self) -> None:
        """Capture the graphs again where they are on (a wake: the tensors they read moved); compiled code is kept."""
        if self.cuda_graph:
            self._graphs.clear()
            self._capture()

    def _dummy(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs of ``bs`` padding rows: they select no slot and write only the scratch row."""
        dev = self.device
        return (
            torch.zeros(bs, dtype=torch.long, device=dev),
            torch.zeros(bs, dtype=torch.long, device=dev),
            torch.full((bs,), self.pool.scratch_slot, dtype=torch.long, device=dev),
            torch.full((bs, self.context_len), self._index_pad, dtype=torch.int32, device=dev),
        )

    def _capture(self) -> None:
        avail = memory_info(self.device)[0] if self.device.type == "cuda" else 0
        logger.info(f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail / GB:.2f} GB")
        begin = time.monotonic()
        try:
            stream = torch.cuda.Stream(device=self.device)
            mempool = torch.cuda.graph_pool_handle()
            logger.info(f"Capture cuda graph bs {self.buckets}")
            with torch.inference_mode():
                # Largest first, as SGLang does, so the smaller graphs reuse the memory pool of the largest.
                for bs in reversed(self.buckets):
                    packed = self._pad_rows(bs)
                    stream.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(stream):
                        for _ in range(2):  # warm-up: lazy init, Triton JIT and compile happen outside capture
                            self._table_step(packed)
                    torch.cuda.current_stream(self.device).wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=mempool, stream=stream):
                        logits, greedy = self._table_step(packed)
                    self._graphs[bs] = _Graph(graph, packed, logits, greedy)
            torch.cuda.synchronize(self.device)
        except Exception as exc:
            raise CaptureError(
                f"Capture cuda graph failed: {exc}\nPossible solutions:\n"
                "1. disable cuda graph by --disable-cuda-graph\n"
                "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
                "3. disable torch compile by not using --enable-torch-compile"
            ) from exc
        after = memory_info(self.device)[0]
        logger.info(
            f"Capture cuda graph end. Time elapsed: {time.monotonic() - begin:.2f} s. "
            f"mem usage={(avail - after) / GB:.2f} GB. avail mem={after / GB:.2f} GB."
        )

    def uses_graph(self, bs: int) -> bool:
        """Whether a batch of ``bs`` rows replays a captured graph."""
        return self.cuda_graph and bs <= self.buckets[-1]

    def _bucket(self, bs: int) -> int:
        return next(b for b in self.buckets if b >= bs)

    def _run_padded(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, idx: torch.Tensor
    ) -> torch.Tensor:
        """The step, its batch padded up to a bucket when compiled (so that only the buckets' shapes compile)."""
        bs = tokens.shape[0]
        if bs > self.buckets[-1] or (not self.torch_compile and not self.cuda_graph):
            return self._step(tokens, positions, slots, idx)
        padded = self._bucket(bs)
        if padded != bs:
            pad_t, pad_p, pad_s, pad_i = self._dummy(padded - bs)
            tokens, positions = torch.cat([tokens, pad_t]), torch.cat([positions, pad_p])
            slots, idx = torch.cat([slots, pad_s]), torch.cat([idx, pad_i])
        return self._step(tokens, positions, slots, idx)[:bs]

    def _pad_rows(self, bs: int) -> torch.Tensor:
        """``bs`` step input rows of padding (on the device): they read no slot and write only the scratch row."""
        rows = torch.tensor([[0, self.pool.scratch_slot, self.pad_row]] * bs, dtype=torch.long)
        return rows.to(self.device)

    def _table_step(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from input rows ``[B, 3]`` on the device: gather tokens and indices, run, choose greedily."""
        positions, slots, rows = packed[:, 0], packed[:, 1], packed[:, 2]
        idx = self.table[rows]
        if not self._paged:
            # The row holds every slot the request reserved; those past its position are not written yet.
            idx = torch.where(self._columns[None, :] <= positions[:, None], idx, -1)
        logits = self._run_padded(self.last_token[rows], positions, slots, idx)
        greedy = logits.argmax(dim=-1)
        self.last_token[rows] = greedy
        return logits, greedy

    @torch.inference_mode()
    def set_row(self, row: int, values: np.ndarray) -> None:
        """Make table row ``row`` hold ``values`` (a request's slots, or its page table), padded after them."""
        self.table[row].fill_(self._index_pad)
        self.table[row, : len(values)].copy_(torch.from_numpy(values.astype(np.int32)))

    @torch.inference_mode()
    def set_tokens(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Record ``tokens`` as the last token of table ``rows`` (a prefill's choice, or a sampled one)."""
        self.last_token[rows] = tokens

    @torch.inference_mode()
    def launch(self, rows: np.ndarray) -> Launched:
        """Queue one decode step for input rows ``[B, 3]`` int64 (position, out slot, table row); nothing waits.

        With a graph for the batch this is one host-to-device copy of the rows (through pinned memory, which the
        caching allocator keeps until the copy is done) and one replay.
        """
        bs = rows.shape[0]
        graph = self._graphs.get(self._bucket(bs)) if self.uses_graph(bs) else None
        if graph is None:
            packed = torch.from_numpy(rows).to(self.device)
            logits, greedy = self._table_step(packed)
            return Launched(logits, greedy, packed[:, 2])
        padded = graph.packed.shape[0]
        host = torch.empty((padded, STEP_COLUMNS), dtype=torch.long, pin_memory=True)
        view = host.numpy()
        view[:bs] = rows
        view[bs:] = (0, self.pool.scratch_slot, self.pad_row)
        graph.packed.copy_(host, non_blocking=True)
        graph.graph.replay()
        return Launched(graph.logits[:bs], graph.greedy[:bs], graph.packed[:bs, 2])

    @torch.inference_mode()
    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, idx: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of one decode step from explicit inputs (as ``ArithModel.decode`` takes them)."""
        return self._run_padded(tokens, positions, slots, idx)
