"""Our decode kernels beside FlashMLA's, in one process on the same inputs (issue 32).

    python scripts/bench_flashmla.py [--json FILE] [--shapes 128x64,16x128,...]

One pool of 1M random rows is quantised once to DeepSeek-V3.2's FP8 layout (``mla_kernels.fp8cache``, 656 bytes a
row, FlashMLA's ``V32``) and dequantised back to bf16, so every kernel below computes the same function of the same
values (the dequantised rows are exact in bf16). Per shape (H heads, B rows; K = 2048 of a 4096-token context, as
``mla_kernels.bench --quick``), graph-timed over inputs 8x the L2:

- ``ours-bf16``: ``mla_kernels.mma.decode`` over the bf16 rows (the Gluon kernels on Hopper);
- ``ours-fp8``: ``mla_kernels.fp8cache.decode(..., "mma")`` over the FP8 rows;
- ``flashmla-fp8``: FlashMLA's sparse decode (``flash_mla_with_kvcache``, legacy SM90 kernels, ``kv_format="V32"``)
  over the same FP8 rows; it takes 64 or 128 heads, so H = 16 runs padded to 64 (4x the MMA work, same bytes);
- ``flashmla-bf16``: FlashMLA's sparse prefill kernel (``flash_mla_sparse_fwd``) with the B decode rows as its query
  tokens, over the bf16 rows: FlashMLA's bf16 sparse attention at decode's shapes (also 64 or 128 heads);
- ``ours-bf16-p1`` (H >= 64): the warpgroup kernel with p as one bf16 part, as FlashMLA's kernels take it;
- ``ours-fp8-deqbf16``, ``ours-fp8-n16`` (H = 16): the FP8 kernel dequantising through bf16, and with 16-row tiles;
- ``read-fp8``, ``read-bf16`` (H = 16): a read-only gather of the same rows as int32 words (best of seven
  configurations): what reading the rows alone costs, the ceiling a decode kernel's gather is judged against.

Every row is checked against a float64 reference on two batch rows by FlashMLA's rule. Floors: bytes over the copy
rate and FLOPs over the matmul rate, both measured in the same run, and the H200's specification (4.8 TB/s, 989
TFLOP/s) beside them. FlashMLA comes from the ``sgl-flash-mla`` wheel when it imports; otherwise its import error
is recorded and its rows are absent.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from mla_kernels import bench
from mla_kernels.bench import QUICK, Timer, bench_decode_case, decode_bytes_flops, environment, measure_ceilings

SPEC_BYTES_PER_S = 4.8e12
SPEC_FLOPS_PER_S = 989e12
DEFAULT_SHAPES = "128x32,128x64,128x128,16x32,16x64,16x128"


def _fp8_variants() -> dict[str, Any]:
    from mla_kernels.mmasync_fp8 import Fp8Config

    return {
        "ours-fp8-deqbf16": Fp8Config(deq_bf16=True),
        "ours-fp8-n16": Fp8Config(block_n=16, num_buf=4),
        "ours-fp8-n16-3sm": Fp8Config(block_n=16, num_buf=3, programs_per_sm=3),
    }


def flashmla() -> tuple[Any, str]:
    """(the flash_mla module or None, what happened when importing it)."""
    try:
        import flash_mla
    except Exception as exc:  # any failure to load is the finding
        return None, f"{type(exc).__name__}: {exc}"
    return flash_mla, f"flash_mla {getattr(flash_mla, '__version__', '?')}, legacy kernels: {flash_mla.has_legacy()}"


def padded(q: torch.Tensor) -> torch.Tensor:
    """q with its heads padded to FlashMLA's 64 (zeros) when it has fewer."""
    b, h, d = q.shape
    if h in (64, 128):
        return q
    out = torch.zeros((b, 64, d), dtype=q.dtype, device=q.device)
    out[:, :h] = q
    return out


def flashmla_calls(fm: Any, cases: list[Any], cache8: torch.Tensor, kvd: torch.Tensor) -> dict[str, Any]:
    """name -> (list of calls, how to cut (out, lse) down to [B, H, 512] and [B, H])."""
    h = cases[0].q.shape[1]
    kc = cache8.view(torch.float8_e4m3fn).view(-1, 64, 1, cache8.shape[1])
    meta = fm.get_mla_metadata()[0]
    qs = [padded(c.q) for c in cases]

    def fp8(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = cases[i]
        out, lse = fm.flash_mla_with_kvcache(
            qs[i].unsqueeze(1), kc, None, None, 512, meta, softmax_scale=c.sm_scale, is_fp8_kvcache=True,
            indices=c.indices.unsqueeze(1), use_legacy=True, kv_format="V32",
        )  # fmt: skip
        return out[:, 0, :h], lse.reshape(lse.shape[0], -1)[:, :h]

    kv3 = kvd.view(kvd.shape[0], 1, kvd.shape[1])

    def bf16(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = cases[i]
        out, _max, lse = fm.flash_mla_sparse_fwd(qs[i], kv3, c.indices.unsqueeze(1), c.sm_scale, 512, use_legacy=True)
        return out[:, :h], lse[:, :h]

    return {"flashmla-fp8": fp8, "flashmla-bf16": bf16}


@triton.jit
def _read_rows(rows_ptr, idx_ptr, out_ptr, K, stride_ib, WORDS: tl.constexpr, TILES: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """Read (and xor together) the WORDS int32 words of the rows one (row, slice) selects: a read with no math."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_W)
    acc = tl.zeros([BLOCK_W], tl.int32)
    for t in range(TILES):
        pos = (s * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + b * stride_ib + pos, mask=pos < K, other=-1)
        rows = tl.where(idx >= 0, idx, 0).to(tl.int64)
        live = (idx >= 0)[:, None] & (cols < WORDS)[None, :]
        tile = tl.load(rows_ptr + rows[:, None] * WORDS + cols[None, :], mask=live, other=0)
        acc = acc ^ tl.xor_sum(tile, axis=0)
    tl.store(out_ptr + (b * tl.num_programs(1) + s) * BLOCK_W + cols, acc)


# (rows per tile, warps, pipeline stages, programs per SM the split aims at): scripts/bench_gather.py's sweep.
READ_CONFIGS = [(16, 4, 3, 4), (32, 4, 3, 2), (32, 4, 4, 4), (32, 8, 3, 2), (64, 8, 3, 2), (16, 4, 4, 8), (32, 4, 2, 4)]


def read_rows(timer: Timer, rows: torch.Tensor, cases: list[Any]) -> tuple[float, str]:
    """The best time of a read-only gather of ``rows`` (viewed as int32 words) at the cases' indices."""
    from mla_kernels.device import program_slots

    words = rows.view(torch.int32)
    w = words.shape[1]
    block_w = triton.next_power_of_2(w)
    best = (float("inf"), "")
    b, k = cases[0].indices.shape
    for block_n, warps, stages, per_sm in READ_CONFIGS:
        splits = max(1, min(k // block_n, -(-per_sm * program_slots(rows) // b)))
        tiles = triton.cdiv(k, splits * block_n)
        out = torch.empty((b * splits * block_w,), dtype=torch.int32, device=rows.device)
        calls = [
            (lambda c=c, o=out, sp=splits, n=block_n, tl_=tiles, wp=warps, st=stages: _read_rows[(b, sp)](
                words, c.indices, o, k, c.indices.stride(0), WORDS=w, TILES=tl_, BLOCK_N=n, BLOCK_W=block_w,
                num_warps=wp, num_stages=st))
            for c in cases
        ]  # fmt: skip
        us = timer.time_rotated(calls)[0]
        if us < best[0]:
            best = (us, f"rows {block_n}, warps {warps}, stages {stages}, splits {splits}")
    return best


def measure_shape(
    timer: Timer, gen: torch.Generator, fm: Any, cache8: torch.Tensor, kvd: torch.Tensor, h: int, b: int
) -> list[dict[str, Any]]:
    """Every row of one (H, B) shape."""
    from mla_kernels import fp8cache, mma, mmasync_fp8, reference, warpgroup
    from mla_kernels.accuracy import compare

    s = QUICK
    k = s.topk
    nbytes, flops = decode_bytes_flops(b, h, k, s)
    cases = [bench_decode_case(gen, b, h, 4096, s) for _ in range(bench.rotation(nbytes, "cuda"))]
    ref = reference.decode(cases[0].q[:2].double(), kvd.double(), cases[0].indices[:2], cases[0].sm_scale, 512,
                           compute_dtype=torch.float64)  # fmt: skip
    runs: dict[str, Callable[[int], Any]] = {
        "ours-bf16": lambda i: mma.decode(cases[i].q, kvd, cases[i].indices, cases[i].sm_scale, 512),
        "ours-fp8": lambda i: fp8cache.decode(cases[i].q, cache8, cases[i].indices, cases[i].sm_scale, "mma"),
    }
    if h >= 64:
        # p as one bf16 part, as FlashMLA's kernels take it (fails FlashMLA's rule on a few elements, as theirs do).
        p1 = warpgroup.WarpgroupConfig(split_p=False)
        runs["ours-bf16-p1"] = lambda i: warpgroup.decode(cases[i].q, kvd, cases[i].indices, cases[i].sm_scale, 512,
                                                          config=p1)  # fmt: skip
    else:
        for name, cfg in _fp8_variants().items():
            runs[name] = lambda i, cfg=cfg: mmasync_fp8.decode(cases[i].q, cache8, cases[i].indices,
                                                               cases[i].sm_scale, 512, config=cfg)  # fmt: skip
    if fm is not None:
        runs.update(flashmla_calls(fm, cases, cache8, kvd))
    fp8_bytes = fp8cache.floor_bytes(b, h, k, k)
    rows = []
    for name, run in runs.items():
        row: dict[str, Any] = {"H": h, "B": b, "K": k, "row": name}
        try:
            out, lse = run(0)
            torch.cuda.synchronize()
            check = compare(out[:2], lse[:2].float(), *ref)
            row.update(check=str(check), check_ok=check.ok)
            row["us"] = timer.time_rotated([lambda i=i, run=run: run(i) for i in range(len(cases))])[0]
        except Exception as exc:
            row.update(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=4))
            rows.append(row)
            continue
        row["bytes"] = fp8_bytes if "fp8" in name else nbytes
        row["flops"] = flops
        rows.append(row)
    if h == 16:
        for name, pool, nb in (("read-fp8", cache8, fp8_bytes), ("read-bf16", kvd, nbytes)):
            us, cfg = read_rows(timer, pool, cases)
            rows.append({"H": h, "B": b, "K": k, "row": name, "us": us, "config": cfg, "bytes": nb, "flops": 0.0,
                         "check": "read only", "check_ok": True})  # fmt: skip
    return rows


def shares(row: dict[str, Any], ceil: dict[str, float]) -> None:
    """Add the floor shares: against the measured ceilings and against the specification."""
    if "us" not in row:
        return
    t = row["us"] * 1e-6
    measured = max(row["bytes"] / ceil["copy_bytes_per_s"], row["flops"] / ceil["bf16_flops_per_s"])
    spec = max(row["bytes"] / SPEC_BYTES_PER_S, row["flops"] / SPEC_FLOPS_PER_S)
    row["floor_pct"] = 100 * measured / t
    row["spec_pct"] = 100 * spec / t
    row["bound"] = (
        "memory" if row["bytes"] / ceil["copy_bytes_per_s"] >= row["flops"] / ceil["bf16_flops_per_s"] else "tensor"
    )
    row["tflops"] = row["flops"] / t / 1e12
    row["tbps"] = row["bytes"] / t / 1e12


def main(argv: list[str] | None = None) -> int:
    """Measure every shape; print the table and the ratios; write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write every row here")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"HxB,... (default {DEFAULT_SHAPES})")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_flashmla needs a GPU; none is visible", file=sys.stderr)
        return 2
    from mla_kernels import fp8cache

    fm, loaded = flashmla()
    print("FlashMLA:", loaded)
    timer = Timer(True)
    ceil = measure_ceilings(timer, "cuda")
    print(f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul {ceil['bf16_flops_per_s'] / 1e12:.0f} "
          "TFLOP/s (spec 4.8 TB/s, 989 TFLOP/s)")  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(0)
    pool = torch.randn((QUICK.pool_tokens, QUICK.d_qk), generator=gen, device="cuda").to(torch.bfloat16)
    cache8 = fp8cache.quantize(pool)
    del pool
    kvd = fp8cache.dequantize(cache8, 512)
    rows: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        h, b = (int(x) for x in shape.split("x"))
        for row in measure_shape(timer, gen, fm, cache8, kvd, h, b):
            shares(row, ceil)
            rows.append(row)
            us = f"{row['us']:8.1f}" if "us" in row else "   error"
            pct = (
                f"{row['floor_pct']:5.1f} % {row['bound']:6s} ({row['spec_pct']:5.1f} % of spec)" if "us" in row else ""
            )
            print(f"H {h:3d} B {b:3d} {row['row']:14s} {us} us {pct}  {row.get('check', row.get('error'))}")
    ratios = []
    for h, b in sorted({(r["H"], r["B"]) for r in rows}):
        got = {r["row"]: r.get("us") for r in rows if (r["H"], r["B"]) == (h, b)}
        for ours in ("ours-bf16", "ours-fp8"):
            for theirs in ("flashmla-fp8", "flashmla-bf16"):
                if got.get(ours) and got.get(theirs):
                    ratios.append({"H": h, "B": b, "ours": ours, "theirs": theirs,
                                   "ours_over_theirs": got[ours] / got[theirs]})  # fmt: skip
    print("time ratios (ours / FlashMLA; below 1.0 is faster than FlashMLA):")
    for r in ratios:
        print(f"  H {r['H']:3d} B {r['B']:3d} {r['ours']:9s} / {r['theirs']:13s} {r['ours_over_theirs']:.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            env = environment(True) | {"command": "python scripts/bench_flashmla.py " + " ".join(sys.argv[1:])}
            json.dump({"environment": env, "flashmla": loaded, "ceilings": ceil, "rows": rows,
                       "ratios": ratios, "fp8_layout": fp8cache.describe()}, handle, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
