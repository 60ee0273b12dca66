"""The lightning indexer (DeepSeek V3.2): score every token of a row, then keep the top-k, in O(L) work per row.

score[b, t] = k_scale[slot] · Σ_h w[b, h] · ReLU(q[b, h] · k[slot]), slot = page_table[b, t // 64]·64 + t % 64.

Shapes are padded to the maximum context M = 64·page_table.shape[1] (as under CUDA graphs), but every loop bound
is the row's length read from a device tensor: the scoring grid is a fixed number of programs per row that stride
over the row's own pages, and the top-k is a radix select over [0, L) (by default split over a fixed number of
programs per row too). Nothing is filled, scanned or launched in proportion to M. ``naive_indexer_topk`` is the
other way (every one of the M/64 pages scored, a -inf filled [B, M] logits tensor and torch.topk over the full
width), kept so the benchmark and the server can show what that costs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mla_kernels.device import interpreting, program_slots, require_triton_device

PAGE = 64  # tokens per page of the index-K cache
# Scoring programs per row come from this many programs per multiprocessor, never from M.
SCORE_PROGRAMS_PER_SM = 4
# The single-program top-k (method="single"): one program per row.
TOPK_BLOCK = 1024
TOPK_WARPS = 8
# The split top-k (method="split"): every row cut into contiguous chunks, one program each, so that a batch of a few
# dozen rows still fills every multiprocessor. Programs per row come from the multiprocessor count and B, never M.
TOPK_SPLIT_BLOCK = 1024
TOPK_SPLIT_WARPS = 4
TOPK_PROGRAMS_PER_SM = 4
TOPK_METHODS = ("auto", "split", "single")
# Bits of the key a radix pass of the split top-k resolves: 8 (four histogram passes of 256 bins) or 11 (three of 2048:
# one launch fewer, and Triton >= 3.8 lowers tl.histogram to a shared-memory atomic per element, so wider bins cost
# about the same per element; older Triton's ballot lowering costs in proportion to the bin count). Which is faster
# on a GPU is for scripts/bench_topk.py to say.
TOPK_RADIX_BITS = 8
# Earlier programs' counts the split gather sums at a time (it loops, so any number of programs per row works).
PART_SCAN = 128


def radix_passes(bits: int) -> int:
    """Histogram passes of the split top-k at ``bits`` a pass: the first pass takes what is left of the 32-bit key."""
    return -(-32 // bits)


def check_indexer_inputs(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    k_scale: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
) -> None:
    """Raise ValueError with a plain message when the indexer's inputs do not fit together."""
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H_I, D_I], got shape {tuple(q.shape)}")
    b, h, d = q.shape
    if tuple(weights.shape) != (b, h):
        raise ValueError(f"weights must be [B, H_I] = {(b, h)}, got {tuple(weights.shape)}")
    if k_cache.dim() != 2 or k_cache.shape[1] != d:
        raise ValueError(f"k_cache must be [slots, D_I={d}], got {tuple(k_cache.shape)}")
    if k_cache.shape[0] % PAGE:
        raise ValueError(f"k_cache must hold whole pages of {PAGE} slots, got {k_cache.shape[0]} slots")
    if tuple(k_scale.shape) != (k_cache.shape[0],):
        raise ValueError(f"k_scale must be [slots] = ({k_cache.shape[0]},), got {tuple(k_scale.shape)}")
    if page_table.dim() != 2 or page_table.shape[0] != b:
        raise ValueError(f"page_table must be [B={b}, pages], got {tuple(page_table.shape)}")
    if tuple(lengths.shape) != (b,):
        raise ValueError(f"lengths must be [B] = ({b},), got {tuple(lengths.shape)}")
    if page_table.dtype != torch.int32 or lengths.dtype != torch.int32:
        raise ValueError(f"page_table and lengths must be int32, got {page_table.dtype} and {lengths.dtype}")
    if d & (d - 1) or h > 256 or d < 16:
        raise ValueError(f"D_I must be a power of two >= 16 and H_I <= 256, got D_I={d}, H_I={h}")


@triton.jit
def _score_kernel(
    q_ptr,
    w_ptr,
    k_ptr,
    ks_ptr,
    pt_ptr,
    len_ptr,
    logits_ptr,
    H,
    M,
    stride_qb,
    stride_qh,
    stride_wb,
    stride_k,
    stride_pb,
    stride_lb,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    FULL_WIDTH: tl.constexpr,
):
    """Program (b, p) scores pages p, p + P, ... of row b while they start below the row's length.

    With FULL_WIDTH it scores every page of the table instead (the O(max_context) form) and writes -inf past the
    row's length, so every column of the row is written.
    """
    pid_b = tl.program_id(0)
    pid_p = tl.program_id(1)
    n_prog = tl.num_programs(1)
    length = tl.minimum(tl.load(len_ptr + pid_b), M)
    limit = M if FULL_WIDTH else length
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    hmask = heads < H
    k_ty = k_ptr.dtype.element_ty
    q = tl.load(q_ptr + pid_b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=hmask[:, None], other=0.0)
    q = q.to(k_ty)
    w = tl.load(w_ptr + pid_b * stride_wb + heads, mask=hmask, other=0.0).to(tl.float32)
    offs = tl.arange(0, PAGE_SIZE)
    page = pid_p
    while page * PAGE_SIZE < limit:
        phys = tl.load(pt_ptr + pid_b * stride_pb + page).to(tl.int64)
        if FULL_WIDTH:
            # Past the length a table entry may hold anything; read page 0 there, as an engine's zero padding does.
            phys = tl.where(page * PAGE_SIZE < length, phys, 0)
        slots = phys * PAGE_SIZE + offs
        k = tl.load(k_ptr + slots[:, None] * stride_k + d[None, :])
        if UPCAST:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        score = tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0) * tl.load(ks_ptr + slots)
        pos = page * PAGE_SIZE + offs
        if FULL_WIDTH:
            tl.store(logits_ptr + pid_b * stride_lb + pos, tl.where(pos < length, score, float("-inf")))
        else:
            tl.store(logits_ptr + pid_b * stride_lb + pos, score, mask=pos < length)
        page += n_prog


def _launch_scores(
    q, weights, k_cache, k_scale, page_table, lengths, logits, programs_per_row: int, full_width: bool = False
) -> None:
    b, h, d = q.shape
    _score_kernel[(b, programs_per_row)](
        q,
        weights,
        k_cache,
        k_scale,
        page_table,
        lengths,
        logits,
        h,
        logits.shape[1],
        q.stride(0),
        q.stride(1),
        weights.stride(0),
        k_cache.stride(0),
        page_table.stride(0),
        logits.stride(0),
        D=d,
        BLOCK_H=max(16, triton.next_power_of_2(h)),
        PAGE_SIZE=PAGE,
        UPCAST=interpreting(),
        FULL_WIDTH=full_width,
        num_warps=4,
        num_stages=2,
    )


def _contiguous_rows(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]


def indexer_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    k_scale: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """Return logits [B, M] fp32 (M = 64·page_table.shape[1]); only columns [0, lengths[b]) are written.

    q [B, H_I, D_I] and k_cache [slots, D_I] share one dtype (fp8 e4m3 or bf16); weights [B, H_I] fp32 carry the
    per-head and q scales; k_scale [slots] fp32; page_table [B, pages] int32; lengths [B] int32 on the device.
    Columns at or past a row's length are left as allocated (torch.empty): writing them would be O(M) work.
    """
    check_indexer_inputs(q, weights, k_cache, k_scale, page_table, lengths)
    require_triton_device(q)
    q, weights, k_cache, page_table = _contiguous_rows(q, weights, k_cache, page_table)
    b, m = q.shape[0], PAGE * page_table.shape[1]
    logits = torch.empty((b, m), dtype=torch.float32, device=q.device)
    # Not capped by the table width: the grid must not shrink or grow with M, only the row's length bounds work.
    per_row = max(1, triton.cdiv(SCORE_PROGRAMS_PER_SM * program_slots(q), b))
    _launch_scores(q, weights, k_cache, k_scale.contiguous(), page_table, lengths, logits, per_row)
    return logits


@triton.jit
def _sort_key(x):
    """Map fp32 to int32 so that signed integer order is float order."""
    i = x.to(tl.int32, bitcast=True)
    return i ^ ((i >> 31) & 0x7FFFFFFF)


@triton.jit
def _emit(out_ptr, dest, pos, ok, pt_ptr, MAP: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Store token positions ``pos`` at ``dest`` (as physical slots through the page table when MAP)."""
    if MAP:
        page = tl.load(pt_ptr + pos // PAGE_SIZE, mask=ok, other=0)
        val = page * PAGE_SIZE + pos % PAGE_SIZE
    else:
        val = pos
    tl.store(out_ptr + dest, val, mask=ok)


@triton.jit
def _place(
    out_ptr, pt_ptr, key, pos, inside, thr, c_above, c_tie, n_above, need, MAP: tl.constexpr, PAGE_SIZE: tl.constexpr
):
    """Write a block's keys above ``thr`` and its first ties still ``need``-ed; return the updated running counts.

    Keys above the threshold take ranks from ``c_above`` up; ties follow every key above it (``n_above``) in order.
    """
    above = inside & (key > thr)
    tie = inside & (key == thr)
    rank_above = c_above + tl.cumsum(above.to(tl.int32), axis=0) - 1
    rank_tie = c_tie + tl.cumsum(tie.to(tl.int32), axis=0) - 1
    dest = tl.where(above, rank_above, n_above + rank_tie)
    _emit(out_ptr, dest, pos, above | (tie & (rank_tie < need)), pt_ptr, MAP, PAGE_SIZE)
    return c_above + tl.sum(above.to(tl.int32), axis=0), c_tie + tl.sum(tie.to(tl.int32), axis=0)


@triton.jit
def _topk_kernel(
    logits_ptr,
    len_ptr,
    pt_ptr,
    out_ptr,
    M,
    stride_lb,
    stride_pb,
    stride_ob,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    MAP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    """Row b: the positions of its TOPK largest logits in [0, L) (unordered), -1 past min(L, TOPK)."""
    pid_b = tl.program_id(0)
    length = tl.maximum(tl.minimum(tl.load(len_ptr + pid_b), M), 0)
    row = logits_ptr + pid_b * stride_lb
    out = out_ptr + pid_b * stride_ob
    pt = pt_ptr + pid_b * stride_pb
    offs = tl.arange(0, BLOCK)
    if length <= TOPK:
        # Every token is kept; the rest of the row is -1.
        start = 0
        while start < TOPK:
            pos = start + offs
            inside = pos < TOPK
            _emit(out, pos, pos, inside & (pos < length), pt, MAP, PAGE_SIZE)
            tl.store(out + pos, -1, mask=inside & (pos >= length))
            start += BLOCK
    else:
        # Radix select, 8 bits a pass from the top: find the key T of the TOPK-th largest logit and how many
        # elements equal to T are still needed (``need``).
        bins = tl.arange(0, 256)
        need = tl.sum(tl.zeros([256], tl.int32), axis=0) + TOPK  # an int32 scalar, not a constexpr
        prefix = need * 0
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros([256], tl.int32)
            start = 0
            while start < length:
                pos = start + offs
                key = _sort_key(tl.load(row + pos, mask=pos < length, other=0.0))
                digit = (key >> shift) & 255
                sel = pos < length
                if p == 0:
                    digit = digit ^ 128  # the sign bit: negative keys sort below positive ones
                else:
                    sel = sel & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                hist += tl.histogram(digit, 256, mask=sel)
                start += BLOCK
            at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
            chosen = tl.max(tl.where(at_or_above >= need, bins, -1), axis=0)
            need -= tl.sum(tl.where(bins > chosen, hist, 0), axis=0)
            if p == 0:
                chosen = chosen ^ 128
            prefix = prefix | (chosen << shift)
        n_above = TOPK - need
        c_above = 0
        c_tie = 0
        start = 0
        while start < length:
            pos = start + offs
            inside = pos < length
            key = _sort_key(tl.load(row + pos, mask=inside, other=0.0))
            c_above, c_tie = _place(out, pt, key, pos, inside, prefix, c_above, c_tie, n_above, need, MAP, PAGE_SIZE)
            start += BLOCK


@triton.jit
def _resolve(hist_ptr, TOPK: tl.constexpr, BITS: tl.constexpr, PASSES: tl.constexpr, DONE: tl.constexpr):
    """From a row's histograms of its first DONE radix passes: the key prefix they fix and ``need``.

    ``need`` is how many of the keys that start with that prefix still belong to the top TOPK. Pass p histograms the
    digit at bit BITS·(PASSES-1-p) (pass 0 the top 32 - BITS·(PASSES-1) bits, sign flipped). Every program of a split
    kernel recomputes this from the [DONE, 2^BITS] counts (a few scans) rather than a per-row step between the passes
    writing it, which would be one more launch per pass.
    """
    bins = tl.arange(0, 1 << BITS)
    need = tl.sum(tl.zeros([1 << BITS], tl.int32), axis=0) + TOPK  # an int32 scalar, not a constexpr
    prefix = need * 0
    for p in tl.static_range(DONE):
        hist = tl.load(hist_ptr + p * (1 << BITS) + bins)
        at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        chosen = tl.max(tl.where(at_or_above >= need, bins, -1), axis=0)
        need -= tl.sum(tl.where(bins > chosen, hist, 0), axis=0)
        if p == 0:
            chosen = chosen ^ (1 << (31 - BITS * (PASSES - 1)))  # back from the flipped sign bit
        prefix = prefix | (chosen << (BITS * (PASSES - 1 - p)))
    return prefix, need


@triton.jit
def _chunk(span, BLOCK: tl.constexpr):
    """The positions [start, end) of [0, span) that program (b, c) of a split kernel covers: whole blocks, contiguous.

    Contiguous (not strided) so that program c's positions all come before program c + 1's: the gather then writes a
    row's picks in position order, exactly as the single-program kernel does.
    """
    blocks = tl.cdiv(span, BLOCK)
    per = tl.cdiv(blocks, tl.num_programs(1))
    start = tl.program_id(1) * per * BLOCK
    end = tl.minimum(start + per * BLOCK, span)
    return start, end


@triton.jit
def _split_hist_kernel(
    logits_ptr,
    len_ptr,
    hist_ptr,
    part_ptr,
    M,
    stride_lb,
    stride_hb,
    stride_pb,
    stride_pc,
    TOPK: tl.constexpr,
    PASS: tl.constexpr,
    BITS: tl.constexpr,
    PASSES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Radix pass PASS of the split top-k: program (b, c) adds its chunk's digit counts to row b's histogram PASS.

    Only keys that match the prefix fixed by the earlier passes count. The last pass also writes the program's own
    counts (``part``) for the gather: suffix sums of its last-digit histogram, then how many of its keys lie above the
    prefix of the earlier passes. Rows of at most TOPK tokens need no select and are skipped.
    """
    pid_b = tl.program_id(0)
    length = tl.maximum(tl.minimum(tl.load(len_ptr + pid_b), M), 0)
    start, end = _chunk(length, BLOCK)
    if (length > TOPK) & (start < end):
        row = logits_ptr + pid_b * stride_lb
        hist_row = hist_ptr + pid_b * stride_hb
        pos = start + tl.arange(0, BLOCK)
        # The first block is loaded before the histograms are read and scanned, so that the two latencies overlap.
        x = tl.load(row + pos, mask=pos < end, other=0.0)
        prefix, need = _resolve(hist_row, TOPK, BITS, PASSES, PASS)
        shift = BITS * (PASSES - 1 - PASS)  # constexprs, as PASS is
        bins = tl.arange(0, 1 << BITS)
        local = tl.zeros([1 << BITS], tl.int32)
        n_high = need * 0
        while start < end:
            nxt = pos + BLOCK
            x_next = tl.load(row + nxt, mask=nxt < end, other=0.0)  # in flight while this block is counted
            inside = pos < end
            key = _sort_key(x)
            if PASS == 0:
                # The top bits with the sign bit flipped, so that negative keys count below positive ones.
                digit = ((key >> shift) & ((1 << (32 - shift)) - 1)) ^ (1 << (31 - shift))
                local += tl.histogram(digit, 1 << BITS, mask=inside)
            else:
                digit = (key >> shift) & ((1 << BITS) - 1)
                match = inside & ((key >> (shift + BITS)) == (prefix >> (shift + BITS)))
                if PASS == PASSES - 1:
                    n_high += tl.sum((inside & ((key >> BITS) > (prefix >> BITS))).to(tl.int32), axis=0)
                # Past the first pass few keys match (past the second, a block rarely holds any): skip the histogram,
                # whose cost is per element whether masked or not, when none does.
                if tl.max(match.to(tl.int32), axis=0) > 0:
                    local += tl.histogram(digit, 1 << BITS, mask=match)
            x = x_next
            pos = nxt
            start += BLOCK
        # One atomic per bin this program saw (not one per key); the host zeroed the histograms.
        tl.atomic_add(hist_row + PASS * (1 << BITS) + bins, local, mask=local > 0, sem="relaxed")
        if PASS == PASSES - 1:
            part = part_ptr + pid_b * stride_pb + tl.program_id(1) * stride_pc
            tl.store(part + bins, tl.sum(local, axis=0) - tl.cumsum(local, axis=0) + local)
            tl.store(part + (1 << BITS), n_high)


@triton.jit
def _split_gather_kernel(
    logits_ptr,
    len_ptr,
    hist_ptr,
    part_ptr,
    pt_ptr,
    out_ptr,
    M,
    stride_lb,
    stride_hb,
    stride_pb,
    stride_pc,
    stride_tb,
    stride_ob,
    TOPK: tl.constexpr,
    BITS: tl.constexpr,
    PASSES: tl.constexpr,
    BLOCK: tl.constexpr,
    MAP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SCAN: tl.constexpr,
):
    """Program (b, c) writes the picks of its chunk of row b: the same positions, in the same slots, as ``single``.

    The histograms give the key T of the TOPK-th largest logit and how many keys equal to T to take; the earlier
    programs' counts (``part``) give how many keys above T and equal to T lie before this chunk, hence where its
    picks go. No atomics: the result is deterministic. A row of at most TOPK tokens keeps all, padded with -1.
    """
    pid_b = tl.program_id(0)
    pid_c = tl.program_id(1)
    length = tl.maximum(tl.minimum(tl.load(len_ptr + pid_b), M), 0)
    start, end = _chunk(tl.maximum(length, TOPK), BLOCK)
    out = out_ptr + pid_b * stride_ob
    pt = pt_ptr + pid_b * stride_tb
    pos = start + tl.arange(0, BLOCK)
    if length <= TOPK:
        while start < end:
            inside = pos < end
            _emit(out, pos, pos, inside & (pos < length), pt, MAP, PAGE_SIZE)
            tl.store(out + pos, -1, mask=inside & (pos >= length))
            pos += BLOCK
            start += BLOCK
    else:
        if start < end:
            row = logits_ptr + pid_b * stride_lb
            x = tl.load(row + pos, mask=pos < end, other=0.0)  # overlaps the histogram and count reads below
            thr, need = _resolve(hist_ptr + pid_b * stride_hb, TOPK, BITS, PASSES, PASSES)
            n_above = TOPK - need
            digit = thr & ((1 << BITS) - 1)
            # Keys above T and equal to T in programs 0 .. c-1; their chunks are nonempty since this one is.
            c_above = need * 0
            c_tie = need * 0
            progs = tl.arange(0, SCAN)
            for first in range(0, pid_c, SCAN):
                c = first + progs
                ok = c < pid_c
                part = part_ptr + pid_b * stride_pb + c * stride_pc
                at_or_above = tl.load(part + digit, mask=ok, other=0)
                above = tl.load(part + digit + 1, mask=ok & (digit < (1 << BITS) - 1), other=0)
                high = tl.load(part + (1 << BITS), mask=ok, other=0)
                c_above += tl.sum(high + above, axis=0)
                c_tie += tl.sum(at_or_above - above, axis=0)
            while start < end:
                nxt = pos + BLOCK
                x_next = tl.load(row + nxt, mask=nxt < end, other=0.0)
                inside = pos < end
                key = _sort_key(x)
                c_above, c_tie = _place(out, pt, key, pos, inside, thr, c_above, c_tie, n_above, need, MAP, PAGE_SIZE)
                x = x_next
                pos = nxt
                start += BLOCK


def topk_programs_per_row(logits: torch.Tensor, rows: int) -> int:
    """Programs per row of the split top-k: about TOPK_PROGRAMS_PER_SM per multiprocessor over all rows."""
    return max(1, triton.cdiv(TOPK_PROGRAMS_PER_SM * program_slots(logits), max(rows, 1)))


def indexer_topk(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    page_table: torch.Tensor | None = None,
    *,
    method: str = "auto",
    block: int | None = None,
    num_warps: int | None = None,
    programs_per_row: int | None = None,
    radix_bits: int = TOPK_RADIX_BITS,
) -> torch.Tensor:
    """Return [B, topk] int32: the positions (or, with ``page_table``, the KV slots) of each row's top-k logits.

    Only logits[b, :lengths[b]] are read; rows shorter than topk keep all their tokens and pad with -1 (so the result
    feeds ``sparse_mla_decode`` directly). The selection is exact: every logit above the topk-th largest, then of those
    equal to it the first by position, as many as fill topk. Both methods write the same result in the same order
    (callers should not rely on the order, but it is deterministic: picks above the threshold by position, then the
    tied ones) and neither reads, launches nor fills anything in proportion to M = logits.shape[1]:

    - ``"split"`` (``"auto"`` on a GPU): an exact radix select, ``radix_bits`` a pass, with
      each row cut into ``programs_per_row`` contiguous chunks (default: from the multiprocessor count and B,
      ``topk_programs_per_row``): ``radix_passes(radix_bits)`` histogram launches that add to a [B, passes,
      2^radix_bits] count, then one that writes; with the count's zeroing, six launches at 8 bits, five at 11. No
      host sync, buffers sized by B and the program count: CUDA-graph capturable.
    - ``"single"``: the same select, 8 bits a pass, in one launch of one program per row; on a GPU it leaves most
      multiprocessors idle at B of a few dozen, but is the simpler kernel. ``"auto"`` picks it under the CPU
      interpreter, which runs programs one after another: there splitting only adds launches (about 4x the time).

    ``block`` (elements a program reads at once, a power of two) and ``num_warps`` are the kernels' tuning
    (``scripts/bench_topk.py``; defaults TOPK_SPLIT_BLOCK/TOPK_SPLIT_WARPS or TOPK_BLOCK/TOPK_WARPS).
    """
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be [B, M] float32, got {tuple(logits.shape)} {logits.dtype}")
    if tuple(lengths.shape) != (logits.shape[0],) or lengths.dtype != torch.int32:
        raise ValueError(f"lengths must be [B] int32 with B={logits.shape[0]}, got {tuple(lengths.shape)}")
    if topk <= 0:
        raise ValueError(f"topk must be positive, got {topk}")
    if page_table is not None and (page_table.dim() != 2 or page_table.shape[0] != logits.shape[0]):
        raise ValueError(f"page_table must be [B, pages], got {tuple(page_table.shape)}")
    if method not in TOPK_METHODS:
        raise ValueError(f"method must be one of {TOPK_METHODS}, got {method!r}")
    if block is not None and (block < 16 or block & (block - 1)):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    if programs_per_row is not None and programs_per_row <= 0:
        raise ValueError(f"programs_per_row must be positive, got {programs_per_row}")
    if not 5 <= radix_bits <= 12:  # at least 32 bins (a warp's worth), at most 16 KiB of shared memory
        raise ValueError(f"radix_bits must be in [5, 12], got {radix_bits}")
    require_triton_device(logits)
    b, m = logits.shape
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    out = torch.empty((b, topk), dtype=torch.int32, device=logits.device)
    if b == 0:
        return out
    table = page_table.contiguous() if page_table is not None else lengths
    stride_tb = table.stride(0) if page_table is not None else 0
    if method == "auto":
        # On the H200 (docs/performance.md, 2026-12-04) split took 36.1 us against single's 42.7 at B = 64,
        # L = 8192, and gave the same result; the interpreter runs programs one after another, so there it only
        # adds launches.
        method = "single" if interpreting() else "split"
    if method == "single":
        _topk_kernel[(b,)](
            logits,
            lengths,
            table,
            out,
            m,
            logits.stride(0),
            stride_tb,
            out.stride(0),
            TOPK=topk,
            BLOCK=block or TOPK_BLOCK,
            MAP=page_table is not None,
            PAGE_SIZE=PAGE,
            num_warps=num_warps or TOPK_WARPS,
        )
        return out
    block = block or TOPK_SPLIT_BLOCK
    num_warps = num_warps or TOPK_SPLIT_WARPS
    per_row = programs_per_row or topk_programs_per_row(logits, b)
    passes, bins = radix_passes(radix_bits), 1 << radix_bits
    # Sized by B, the bins and the program count only. The histograms must start at zero (their programs add to
    # them). ``part`` (a program's suffix counts of the last digit, then its count above the earlier passes' prefix,
    # padded to 32 bytes) is written before it is read: by every program whose chunk is nonempty, the only ones the
    # gather reads.
    hist = torch.zeros((b, passes * bins), dtype=torch.int32, device=logits.device)
    part = torch.empty((b, per_row, bins + 8), dtype=torch.int32, device=logits.device)
    for p in range(passes):
        _split_hist_kernel[(b, per_row)](
            logits,
            lengths,
            hist,
            part,
            m,
            logits.stride(0),
            hist.stride(0),
            part.stride(0),
            part.stride(1),
            TOPK=topk,
            PASS=p,
            BITS=radix_bits,
            PASSES=passes,
            BLOCK=block,
            num_warps=num_warps,
        )
    _split_gather_kernel[(b, per_row)](
        logits,
        lengths,
        hist,
        part,
        table,
        out,
        m,
        logits.stride(0),
        hist.stride(0),
        part.stride(0),
        part.stride(1),
        stride_tb,
        out.stride(0),
        TOPK=topk,
        BITS=radix_bits,
        PASSES=passes,
        BLOCK=block,
        MAP=page_table is not None,
        PAGE_SIZE=PAGE,
        SCAN=PART_SCAN,
        num_warps=num_warps,
    )
    return out


def lightning_indexer(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    k_scale: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    *,
    topk_method: str = "auto",
) -> torch.Tensor:
    """Score each row over its own length and return its top-k KV slots [B, topk] int32 (-1 padded).

    ``topk_method`` is ``indexer_topk``'s ``method`` (all give the same result).
    """
    logits = indexer_scores(q, weights, k_cache, k_scale, page_table, lengths)
    return indexer_topk(logits, lengths, topk, page_table, method=topk_method)


def naive_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    k_scale: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """The O(max_context) form (the seed's bug, kept as a variant to catch): same result, work sized by M, not L.

    Every source of O(M) work the reference notes list for a decode step: a scoring program per page of the padded
    table, each scoring its page whatever the row's length (padded entries point at page 0, so they read real
    keys and score them; the kernel then writes -inf past the length), a [B, M] logits tensor filled with -inf
    every call, and torch.topk over the full width.
    """
    check_indexer_inputs(q, weights, k_cache, k_scale, page_table, lengths)
    require_triton_device(q)
    q, weights, k_cache, page_table = _contiguous_rows(q, weights, k_cache, page_table)
    b, pages = page_table.shape
    m = PAGE * pages
    k = min(topk, m)
    logits = torch.full((b, m), float("-inf"), dtype=torch.float32, device=q.device)
    _launch_scores(q, weights, k_cache, k_scale.contiguous(), page_table, lengths, logits, pages, full_width=True)
    values, pos = torch.topk(logits, k, dim=1)
    pos = pos.to(torch.int32)
    slots = torch.gather(page_table, 1, (pos // PAGE).long()) * PAGE + pos % PAGE
    slots = torch.where(values == float("-inf"), torch.full_like(slots, -1), slots)
    if k < topk:
        slots = torch.cat([slots, slots.new_full((b, topk - k), -1)], dim=1)
    return slots
