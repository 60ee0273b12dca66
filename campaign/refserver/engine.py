"""The engine: loads the model, sizes the KV pool, and runs continuous batching over it.

Lifecycle: ``Engine(args)`` loads the weights, allocates the pool, compiles and captures (logging SGLang's phase
lines); ``submit()`` queues a request and ``step()`` runs one scheduler iteration, on the caller's thread. The
server runs that loop in a process of its own (``engine_process``), apart from the HTTP one, as SGLang runs its
scheduler; ``generate()`` runs requests to completion through the same steps, for the accuracy test and the GPU
check.

Each scheduler step admits waiting requests while slots and ``--max-running-requests`` allow (a request reserves
prompt + max_new_tokens slots up front; the rest wait in the queue), prefills the newly admitted ones in batches
(as many prompts as ``PREFILL_CHUNK`` and ``PREFILL_SCORES`` allow), then runs one decode step for every running
request together: requests join and leave the decode batch between steps.

A long-context model (one with a lightning indexer) gets a paged pool and decodes through the indexer: each layer
keeps its ``--index-topk`` best-scored tokens of the request, found by mla_kernels' O(context) indexer
(``--indexer aware``) or its O(max_context) form (``naive``), whose cost grows with ``--context-length``.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from campaign.refserver.decode_runner import STEP_COLUMNS, DecodeRunner
from campaign.refserver.fault import check_fault
from campaign.refserver.kvpool import GB, KVPool, memory_info, pool_tokens
from campaign.refserver.log import logger
from campaign.refserver.model import INDEXER_MODES, IndexPool, load_model
from campaign.refserver.request import Request, Stats, TokenLogprob
from campaign.refserver.tokenizer import EOS, PAD
from mla_kernels import fp8cache

WEIGHTS = Path(__file__).parent / "weights" / "arith.safetensors"
#: The long-context model: the same arithmetic after thousands of tokens of filler, with a lightning indexer.
LONGCTX_WEIGHTS = Path(__file__).parent / "weights" / "longctx.safetensors"
#: Most requests prefilled in one forward pass (bounds the prefill's activation memory).
PREFILL_CHUNK = 512
#: Most ``requests x width²`` in one prefill pass: the indexer's scores and top-k mask are that size.
PREFILL_SCORES = 1 << 27
#: Tokens per page of a long-context model's pool (the indexer's page).
INDEX_PAGE = 64


@dataclass(frozen=True)
class EngineArgs:
    """The server's engine settings (the command-line flags of the same names)."""

    model_path: Path = WEIGHTS
    device: str = "cpu"
    attention_backend: str = "torch"
    enable_torch_compile: bool = False
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 64
    #: Where CUDA graphs cannot be captured, decode eagerly (and say so) instead of failing the start.
    cuda_graph_fallback: bool = False
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    max_running_requests: int = 128
    decode_log_interval: int = 40
    #: A deliberate attention fault (``campaign.refserver.fault``), for testing the checks; None in normal use.
    inject_fault: str | None = None
    #: Longest request (prompt + completion); default the model's, capped by the pool when that is smaller.
    context_length: int | None = None
    #: Long-context models: which form of the indexer decode runs, and how many tokens it keeps (default the model's).
    indexer: str = "aware"
    index_topk: int | None = None
    #: The aware indexer's top-k kernel: ``auto``, ``single`` (one program a row) or ``split`` (several a row).
    index_topk_method: str = "auto"
    #: Weights and KV pool: ``auto`` keeps the weights file's dtype (fp32); ``bfloat16`` is what the MMA kernel's
    #: tensor cores take (with fp32 KV rows it multiplies in IEEE fp32 on CUDA cores).
    dtype: str = "auto"
    #: KV pool rows: ``auto`` (the model's dtype) or ``fp8_e4m3`` (mla_kernels.fp8cache: DeepSeek-V3.2's layout).
    kv_cache_dtype: str = "auto"


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")


class Engine:
    """See the module docstring."""

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda asked for, but torch sees no CUDA device")
        avail = memory_info(self.device)[0]
        logger.info(f"Load weight begin. avail mem={avail / GB:.2f} GB")
        self.model, self.metadata = load_model(args.model_path, args.device)
        if args.dtype != "auto":
            if args.dtype not in DTYPES:
                raise ValueError(f"--dtype {args.dtype!r}: choose auto or one of {', '.join(DTYPES)}")
            self.model.to(DTYPES[args.dtype])
        self.cfg = self.model.cfg
        self.model_id = self.metadata.get("model_id", "campaign-arith-mla")
        dtype = next(self.model.parameters()).dtype
        logger.info(
            f"Load weight end. type={type(self.model).__name__}, dtype={dtype}, "
            f"avail mem={memory_info(self.device)[0] / GB:.2f} GB"
        )
        cfg = self.cfg
        if args.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {args.kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
        # FP8 rows: bytes per row instead of values (ValueError for a latent the layout cannot tile).
        fp8_row = fp8cache.row_bytes(cfg.d_latent, cfg.d_rope) if args.kv_cache_dtype == "fp8_e4m3" else None
        row_bytes = fp8_row if fp8_row is not None else cfg.d_qk * dtype.itemsize
        bytes_per_token = cfg.n_layers * (row_bytes + cfg.index_dim * dtype.itemsize)
        n_tokens = pool_tokens(
            self.device,
            bytes_per_token,
            max_total_tokens=args.max_total_tokens,
            mem_fraction_static=args.mem_fraction_static,
        )
        # Without --context-length a pool smaller than the model's context caps it, as the pool is what can be served.
        self.context_len = args.context_length or min(cfg.context_len, n_tokens)
        if n_tokens < self.context_len:
            raise RuntimeError(
                f"The KV pool holds {n_tokens} tokens, fewer than one request's context ({self.context_len}). "
                "Increase --max-total-tokens or --mem-fraction-static."
            )
        if args.indexer not in INDEXER_MODES:
            raise ValueError(f"--indexer {args.indexer!r}: choose one of {', '.join(INDEXER_MODES)}")
        self.index_topk = (args.index_topk or cfg.index_topk) if cfg.has_indexer else 0
        page = INDEX_PAGE if cfg.has_indexer else 1
        self.pool = KVPool(
            cfg.n_layers,
            n_tokens,
            cfg.d_qk,
            dtype,
            self.device,
            page_size=page,
            index_dim=cfg.index_dim,
            fp8_row_bytes=fp8_row,
        )
        index_note = f", indexer keys {cfg.index_dim}" if cfg.has_indexer else ""
        fp8_note = f", kv_cache_dtype=fp8_e4m3 ({fp8_row} bytes a row)" if fp8_row is not None else ""
        logger.info(
            f"KV Cache is allocated. #tokens: {self.pool.n_tokens}, KV size: {self.pool.nbytes / GB:.4f} GB "
            f"(latent {cfg.d_latent} + rope {cfg.d_rope}{index_note} per token per layer, page size {page}{fp8_note})"
        )
        logger.info(f"Memory pool end. avail mem={memory_info(self.device)[0] / GB:.2f} GB")
        check_fault(args.inject_fault)
        if args.inject_fault is not None:
            logger.warning(f"Fault injection on: {args.inject_fault}. This server computes wrong on purpose.")
        self.index: IndexPool | None = None
        width = self.context_len
        if cfg.has_indexer:
            assert self.pool.index_rows is not None
            self.index = IndexPool(
                self.pool.index_rows, self.pool.k_scale, args.indexer, self.index_topk, args.index_topk_method
            )
            width = -(-self.context_len // INDEX_PAGE)  # the page table: the naive form's work follows it
        self.runner = DecodeRunner(
            self.model,
            self.pool,
            args.attention_backend,
            torch_compile=args.enable_torch_compile,
            cuda_graph=not args.disable_cuda_graph,
            cuda_graph_max_bs=args.cuda_graph_max_bs,
            fault=args.inject_fault,
            cuda_graph_fallback=args.cuda_graph_fallback,
            index=self.index,
            index_width=width,
            max_requests=args.max_running_requests,
        )
        self.runner.prepare()
        # What runs, after any fallback: the line campaign's effective-config check reads.
        indexer = (
            f"{args.indexer}, index_topk={self.index_topk}, index_topk_method={args.index_topk_method}"
            if self.index is not None
            else "none"
        )
        logger.info(
            f"max_total_num_tokens={self.pool.n_tokens}, max_running_requests={args.max_running_requests}, "
            f"context_len={self.context_len}, attention_backend={self.runner.backend}, "
            f"torch_compile={self.runner.torch_compile}, cuda_graph={self.runner.cuda_graph}, "
            f"kv_cache_dtype={args.kv_cache_dtype}, indexer={indexer}"
        )
        self.stats = Stats()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        #: The decode step launched and not yet handed out (the overlap); table rows not held by a request.
        self._pending: _Step | None = None
        self._free_rows = list(range(args.max_running_requests))[::-1]
        self.fatal: BaseException | None = None
        self._decode_steps = 0
        self._log_tokens = 0
        self._log_time = time.monotonic()
        self._gen = torch.Generator(device=self.device).manual_seed(0)

    # ---- requests -------------------------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue ``request``; its sink receives its tokens as ``step`` makes them. Raises when the engine died."""
        if self.fatal is not None:
            raise RuntimeError(f"the engine stopped after an error: {self.fatal}")
        self._waiting.append(request)
        self.stats.queued = len(self._waiting)

    def abort(self, request: Request) -> None:
        """Stop generating for ``request`` (its client went away); its slots return at the next step."""
        request.aborted = True

    @property
    def idle(self) -> bool:
        """Whether no request waits or runs (a scheduler loop may then block until one comes)."""
        return not (self._waiting or self._running or self._pending)

    @property
    def token_usage(self) -> float:
        """The share of KV pool slots reserved by requests."""
        return self.pool.used_slots / self.pool.n_tokens

    def generate(
        self, prompts: Sequence[list[int]], max_new_tokens: int, *, ignore_eos: bool = False
    ) -> list[list[int]]:
        """Greedy outputs of ``prompts``, run to completion on this thread through the scheduler's own steps."""
        requests = [Request(list(p), max_new_tokens, ignore_eos=ignore_eos) for p in prompts]
        for request in requests:
            self._waiting.append(request)
        while not self.idle:
            self.step()
        return [r.output for r in requests]

    # ---- the scheduler --------------------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Record that a step raised ``exc``: the engine is dead; log why and end every request with ``error``."""
        self.fatal = exc
        logger.error(f"Scheduler hit an exception: {''.join(traceback.format_exception(exc))}")
        for request in [*self._running, *self._waiting]:
            if request.sink is not None:
                request.sink(None, "error")

    def step(self) -> None:
        """One scheduler iteration: admit, prefill the admitted, then decode everything running.

        Decode overlaps the host with the device, as SGLang's overlap scheduler does: a step launches the next
        decode step first (its input tokens are on the device already) and only then waits for the previous one and
        hands out its tokens, so that host work (the tokens' delivery, the server's messages) runs while the device
        computes. A request that stops at a token still on its way has had one step too many; its token is dropped.
        """
        admitted = self._admit()
        if admitted:
            self._deliver()  # a prefill waits for the device anyway; the running requests' tokens go out first
            for batch in prefill_batches(admitted):
                self._prefill(batch)
            self._drop_finished()
        began = time.perf_counter()
        launched = self._launch_decode() if self._running else None
        delivered = self._deliver()
        self._pending = launched
        if launched is not None or delivered:
            self.stats.decode_seconds += time.perf_counter() - began
        self._drop_finished()
        self.stats.running = len(self._running)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        while self._waiting and len(self._running) + len(admitted) < self.args.max_running_requests:
            request = self._waiting[0]
            if request.aborted:
                self._waiting.popleft()
                continue
            slots = self.pool.reserve(len(request.prompt) + request.max_new_tokens)
            if slots is None:
                break  # the pool is full: it waits for running requests to end
            request.slots = slots
            request.row = self._free_rows.pop()
            self.runner.set_row(request.row, self.pool.page_table(slots) if self.index is not None else slots)
            admitted.append(self._waiting.popleft())
        self.stats.queued = len(self._waiting)
        self._running.extend(admitted)
        return admitted

    # Inference mode for the inputs too: tensors made outside it differ in dispatch keys from those a compiled step
    # was traced with, which makes torch.compile recompile until it gives up (seen on the H200).
    @torch.inference_mode()
    def _prefill(self, batch: list[Request]) -> None:
        width = max(len(r.prompt) for r in batch)
        tokens = np.full((len(batch), width), PAD, dtype=np.int64)
        slots = np.full((len(batch), width), self.pool.scratch_slot, dtype=np.int64)
        for i, request in enumerate(batch):
            n = len(request.prompt)
            assert request.slots is not None
            tokens[i, :n] = request.prompt
            slots[i, :n] = request.slots[:n]
        last = torch.tensor([len(r.prompt) - 1 for r in batch], device=self.device)
        logits = self.model(
            torch.from_numpy(tokens).to(self.device),
            self.pool.rows,
            torch.from_numpy(slots).to(self.device),
            index_keys=self.pool.index_rows,
            topk=self.index_topk or None,
        )
        logits = logits[torch.arange(len(batch), device=self.device), last]
        self.stats.prompt_tokens += sum(len(r.prompt) for r in batch)
        rows = torch.tensor([r.row for r in batch], device=self.device)
        chosen = self._choose(batch, logits, logits.argmax(dim=-1), rows, recorded=False)
        logprobs = self._logprobs(batch, logits, chosen, wait=True)
        self._hand_out(batch, chosen.tolist(), _logprob_records(logprobs) if logprobs is not None else None)

    @torch.inference_mode()
    def _launch_decode(self) -> _Step | None:
        """Queue a decode step for every running request that still needs a token; nothing waits for the device."""
        batch = [r for r in self._running if r.finish_reason is None and not r.aborted and not self._done(r)]
        if not batch:
            return None
        rows = np.empty((len(batch), STEP_COLUMNS), dtype=np.int64)
        positions = 0
        for i, request in enumerate(batch):
            assert request.slots is not None and request.row is not None
            pos = request.length + request.in_flight - 1  # the last token chosen is not cached yet
            rows[i] = (pos, request.slots[pos], request.row)
            positions += pos
            request.in_flight += 1
        if self.index is not None:
            k = self.runner.context_len
            per_layer = positions + len(batch) if self.index.mode == "aware" else len(batch) * k * INDEX_PAGE
            self.stats.index_logits += per_layer * self.cfg.n_layers
        launched = self.runner.launch(rows)
        chosen = self._choose(batch, launched.logits, launched.greedy, launched.rows, recorded=True)
        logprobs = self._logprobs(batch, launched.logits, chosen, wait=False)
        # Copies into pinned memory that the next step's launch does not wait for; an event says when they are done.
        tokens = chosen.to("cpu", non_blocking=True)
        event = torch.cuda.Event() if self.device.type == "cuda" else None
        if event is not None:
            event.record()
        return _Step(batch, tokens, logprobs, event)

    def _done(self, request: Request) -> bool:
        """Whether the tokens already chosen (delivered or on their way) reach the request's ``max_new_tokens``."""
        return len(request.output) + request.in_flight >= request.max_new_tokens

    def _deliver(self) -> bool:
        """Wait for the pending decode step, if any, and hand out its tokens; whether there was one."""
        step, self._pending = self._pending, None
        if step is None:
            return False
        if step.event is not None:
            waited = time.perf_counter()
            step.event.synchronize()
            self.stats.decode_wait_seconds += time.perf_counter() - waited
        for request in step.batch:
            request.in_flight -= 1
        records = _logprob_records(step.logprobs) if step.logprobs is not None else None
        self._hand_out(step.batch, step.tokens.tolist(), records)
        self.stats.decode_steps += 1
        self.stats.decode_tokens += len(step.batch)
        self._decode_steps += 1
        self._log_tokens += len(step.batch)
        if self._decode_steps % self.args.decode_log_interval == 0:
            now = time.monotonic()
            logger.info(
                f"Decode batch. #running-req: {len(step.batch)}, #token: {self.pool.used_slots}, "
                f"token usage: {self.pool.used_slots / self.pool.n_tokens:.2f}, "
                f"cuda graph: {self.runner.uses_graph(len(step.batch))}, "
                f"gen throughput (token/s): {self._log_tokens / max(now - self._log_time, 1e-9):.2f}, "
                f"#queue-req: {len(self._waiting)}"
            )
            self._log_tokens, self._log_time = 0, now
        return True

    def _choose(
        self, batch: list[Request], logits: torch.Tensor, greedy: torch.Tensor, rows: torch.Tensor, *, recorded: bool
    ) -> torch.Tensor:
        """Each request's next token on the device (greedy, or sampled at its temperature), made its row's last
        token for the next step (``recorded``: a decode step has made the greedy one so already)."""
        temps = [r.temperature for r in batch]
        if not any(t > 0 for t in temps):
            if not recorded:
                self.runner.set_tokens(rows, greedy)
            return greedy
        t = torch.tensor([max(x, 1e-6) for x in temps], device=logits.device)[:, None]
        probs = torch.softmax(logits.float() / t, dim=-1)
        sampled = torch.multinomial(probs, 1, generator=self._gen).squeeze(1)
        chosen = torch.where(t.squeeze(1) > 1e-6, sampled, greedy)
        self.runner.set_tokens(rows, chosen)
        return chosen

    def _logprobs(
        self, batch: list[Request], logits: torch.Tensor, chosen: torch.Tensor, *, wait: bool
    ) -> _Logprobs | None:
        """The chosen tokens' log-probabilities and the top ones (None when no request asks), copied to the host;
        without ``wait`` the copies are still on their way when this returns (the step's event covers them)."""
        widest = max((r.logprobs or 0 for r in batch if r.logprobs is not None), default=-1)
        if widest < 0:
            return None
        logp = torch.log_softmax(logits.float(), dim=-1)
        chosen_lp = logp.gather(1, chosen[:, None]).squeeze(1)
        top_lp, top_id = logp.topk(min(widest, logp.shape[-1]), dim=-1)
        wanted = [r.logprobs for r in batch]
        non_blocking = logits.is_cuda and not wait
        return _Logprobs(wanted, *(x.to("cpu", non_blocking=non_blocking) for x in (chosen_lp, top_lp, top_id)))

    def _hand_out(self, batch: list[Request], tokens: list[int], records: list[TokenLogprob] | None) -> None:
        """Append each request's token (and its log-probability), mark the finished, and call the sinks.

        A request already finished or aborted gets nothing: its token came from a step launched before that was known.
        """
        for i, (request, token) in enumerate(zip(batch, tokens, strict=True)):
            if request.finish_reason is not None or request.aborted:
                continue
            request.output.append(token)
            if records is not None and request.logprobs is not None:
                request.token_logprobs.append(records[i])
            self.stats.generation_tokens += 1
            if token == EOS and not request.ignore_eos:
                request.finish_reason = "stop"
            elif len(request.output) >= request.max_new_tokens:
                request.finish_reason = "length"
            if request.sink is not None:
                request.sink(token, request.finish_reason)

    def _drop_finished(self) -> None:
        keep: list[Request] = []
        for request in self._running:
            if (request.finish_reason is not None or request.aborted) and not request.in_flight:
                assert request.slots is not None and request.row is not None
                self.pool.release(request.slots)
                self._free_rows.append(request.row)
                request.slots, request.row = None, None
                self.stats.requests_finished += 1
            else:
                keep.append(request)
        self._running = keep


@dataclass
class _Logprobs:
    """A step's log-probabilities on their way to the host: per row, the chosen token's and the top ones."""

    wanted: list[int | None]
    chosen: torch.Tensor
    top_lp: torch.Tensor
    top_id: torch.Tensor


def _logprob_records(lp: _Logprobs) -> list[TokenLogprob]:
    """The rows of ``lp`` as ``TokenLogprob``s, each with as many top entries as its request asked for."""
    chosen, top_lp, top_id = lp.chosen.tolist(), lp.top_lp.tolist(), lp.top_id.tolist()
    return [
        TokenLogprob(chosen[i], list(zip(top_id[i][: k or 0], top_lp[i][: k or 0], strict=True)))
        for i, k in enumerate(lp.wanted)
    ]


@dataclass
class _Step:
    """A decode step launched and not yet handed out: its requests, their tokens (host copies on their way)."""

    batch: list[Request]
    tokens: torch.Tensor
    logprobs: _Logprobs | None
    event: torch.cuda.Event | None


def prefill_batches(requests: list[Request]) -> list[list[Request]]:
    """``requests`` in prefill passes of at most ``PREFILL_CHUNK`` prompts and ``PREFILL_SCORES`` requests x
    width² (the widest prompt of the pass), in order."""
    batches: list[list[Request]] = []
    current: list[Request] = []
    width = 0
    for request in requests:
        wider = max(width, len(request.prompt))
        if current and (len(current) >= PREFILL_CHUNK or (len(current) + 1) * wider * wider > PREFILL_SCORES):
            batches.append(current)
            current, wider = [], len(request.prompt)
        current.append(request)
        width = wider
    if current:
        batches.append(current)
    return batches
