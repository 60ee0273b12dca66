"""Offline sm_90 compile report: registers, spills, shared memory and the SASS instruction mix, with no GPU.

    python -m mla_kernels.sass [--json FILE] [--config NAME ...] [--shape HxB ...]

Triton compiles a kernel for a Hopper target on any machine (``triton.compile(ASTSource(...),
target=GPUTarget("cuda", 90, 32))``); its bundled ``ptxas -v`` gives registers and spill bytes, ``cuobjdump`` the
SASS. Pointers, strides and K get the divisibility-16 hint the JIT gives them on the device (without it the counts
differ from the device's). Each loop is found by its backward branch; the per-tile figures count the inner loop's
body once per trip, so "FFMA share" is the fraction of a tile's issued instructions that are the FMAs the kernel
exists for: an issue-bound SIMT kernel cannot run faster than its FMA floor divided by that share.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict
from typing import Any

OPCODES = ("FFMA", "FMUL", "FADD", "HMMA", "HGMMA", "LDG", "LDGSTS", "LDS", "STS", "SHFL", "BAR", "MUFU", "PRMT",
           "SHF", "IMAD", "LDL", "STL")  # fmt: skip
_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)")
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]*)([^;]*);")


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_sm90(
    fn: Any, signature: dict[str, str], constexprs: dict[str, Any], num_warps: int, num_stages: int
) -> dict[str, Any]:
    """Compile the jit function ``fn`` for sm_90; return registers, spills, shared bytes, opcode counts and loops.

    ``signature`` maps every non-constexpr argument to its Triton type ("*bf16", "i32", ...).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise ValueError("the kernels were defined under TRITON_INTERPRET=1; compile offline in a process without it")
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    hinted = [n for n, t in signature.items() if t.startswith("*") or n.startswith("stride") or n == "K"]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in hinted}
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn, sig, constexprs, attrs)
    else:
        src = ASTSource(fn, sig, constexprs, attrs)
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        arch = re.search(r"\.target\s+(sm_\w+)", compiled.asm["ptx"])
        verbose = subprocess.run(
            [_tool("ptxas"), f"-arch={arch.group(1) if arch else 'sm_90a'}", "-v", ptx, "-o", cubin],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True).stdout
    regs = re.search(r"Used (\d+) registers", verbose)
    spill_st = re.search(r"(\d+) bytes spill stores", verbose)
    spill_ld = re.search(r"(\d+) bytes spill loads", verbose)
    stack = re.search(r"(\d+) bytes stack frame", verbose)
    ins = [(int(m.group(1), 16), m.group(2).split(".")[0], m.group(3)) for m in _SASS_LINE.finditer(sass)]
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "spill_store_bytes": int(spill_st.group(1)) if spill_st else -1,
        "spill_load_bytes": int(spill_ld.group(1)) if spill_ld else -1,
        "stack_bytes": int(stack.group(1)) if stack else -1,
        "shared_bytes": int(compiled.metadata.shared),
        "ops": {k: v for k, v in collections.Counter(op for _, op, _ in ins).items() if k in OPCODES},
        "instructions": len(ins),
        "loops": _loops(ins),
        "wgmma_shapes": sorted(set(_WGMMA.findall(compiled.asm["ptx"]))),
    }


def _loops(ins: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    """Each backward branch's loop: its address range and opcode counts, innermost (smallest) first."""
    out = []
    for addr, op, args in ins:
        target = re.search(r"0x([0-9a-f]+)", args) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            body = collections.Counter(o for a, o, _ in ins if lo <= a <= addr)
            out.append({"start": lo, "end": addr, "size": sum(body.values()), "ops": dict(body)})
    return sorted(out, key=lambda lp: lp["size"])


def per_tile(report: dict[str, Any], inner_trips: int) -> dict[str, Any]:
    """Issued instructions per thread and tile for a two-level loop nest whose inner loop runs ``inner_trips`` times."""
    loops = report["loops"]
    if len(loops) < 2:
        return {}
    inner, outer = loops[0], loops[1]

    def count(op: str | None) -> int:
        get = (lambda lp: lp["size"]) if op is None else (lambda lp: lp["ops"].get(op, 0))
        return get(outer) - get(inner) + inner_trips * get(inner)

    total = count(None)
    return {
        "instructions": total,
        "FFMA": count("FFMA"),
        "FMUL": count("FMUL"),
        "LDS": count("LDS"),
        "prmt_shf": count("PRMT") + count("SHF"),
        "ffma_share": round(count("FFMA") / total, 3),
    }


def _decode_signature(q_type: str) -> dict[str, str]:
    """The Triton types of the decode kernels' non-constexpr arguments (q as ``q_type``, KV bf16)."""
    return {
        "q_ptr": q_type, "kv_ptr": "*bf16", "idx_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
        "part_ptr": "*fp32", "plse_ptr": "*fp32", "scale_log2": "fp32", "H": "i32", "N": "i32", "K": "i32",
        "stride_qb": "i32", "stride_qh": "i32", "stride_kv": "i32", "stride_ib": "i32",
    }  # fmt: skip


def tiled_report(h: int, b: int, cfg: Any, k: int = 2048, d_qk: int = 576, d_v: int = 512) -> dict[str, Any]:
    """Compile the tiled SIMT kernel as it launches at H heads, B rows, top-k K on a 132-SM H200."""
    import torch
    import triton

    from mla_kernels import simt_tiled
    from mla_kernels.merge import plan_head_groups

    # The split plan for a 132-SM H200 (no GPU here to ask; a meta tensor carries the shape).
    plan = plan_head_groups(torch.empty((b, h, d_qk), device="meta"), k, cfg, slots=132)
    splits, per_split = plan.num_splits, plan.tiles_per_split
    signature = _decode_signature("*fp32")
    constexprs = {
        "TILES_PER_SPLIT": per_split,
        "NUM_SPLITS": splits,
        "D_QK": d_qk,
        "D_V": d_v,
        "BLOCK_H": cfg.block_h,
        "BLOCK_N": cfg.block_n,
        "BLOCK_D": cfg.block_d,
        "BLOCK_DV": triton.next_power_of_2(d_v),
        "NUM_CHUNKS": triton.cdiv(d_qk, cfg.block_d),
        "CHUNK_STAGES": cfg.chunk_stages,
        "DIRECT": splits == 1,
        "OUT_RTNE": False,
    }
    rep = compile_sm90(simt_tiled._tiled_decode_kernel, signature, constexprs, cfg.num_warps, cfg.num_stages)
    rep.update(H=h, B=b, config=asdict(cfg), splits=splits, tiles_per_split=per_split)
    rep["per_tile"] = per_tile(rep, triton.cdiv(d_qk, cfg.block_d))
    # Programs resident per SM from registers alone (65,536 per SM, allocated per warp in units of 256).
    regs_per_warp = -(-max(rep["registers"], 1) * 32 // 256) * 256
    rep["programs_per_sm_by_registers"] = 65536 // (regs_per_warp * cfg.num_warps)
    return rep


def mma_report(h: int, b: int, cfg: Any, k: int = 2048, d_qk: int = 576, d_v: int = 512) -> dict[str, Any]:
    """Compile the (unswapped) MMA kernel with bf16 inputs as it launches at H heads, B rows on a 132-SM H200."""
    import torch
    import triton

    from mla_kernels import mma
    from mla_kernels.merge import plan_head_groups

    plan = plan_head_groups(torch.empty((b, h, d_qk), device="meta"), k, cfg, slots=132, per_group=1 + cfg.v_split)
    block_dv = triton.next_power_of_2(d_v)
    signature = _decode_signature("*bf16")
    constexprs = {
        "TILES_PER_SPLIT": plan.tiles_per_split, "NUM_SPLITS": plan.num_splits, "D_V": d_v, "D_R": d_qk - d_v,
        "BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n, "BLOCK_DA": block_dv // 2 if cfg.halves else block_dv,
        "BLOCK_DR": max(16, triton.next_power_of_2(d_qk - d_v)), "HALVES": cfg.halves, "MASK_ROWS": cfg.mask_rows,
        "DIRECT": plan.num_splits == 1, "PRECISION": "tf32", "UPCAST": False, "P_RTNE": False, "OUT_RTNE": False,
        "SPLIT_P": cfg.split_p, "TRIGGER": False, "V_SPLIT": cfg.v_split and cfg.halves,
    }  # fmt: skip
    rep = compile_sm90(mma._mma_decode_kernel, signature, constexprs, cfg.num_warps, cfg.num_stages)
    rep.update(H=h, B=b, config=asdict(cfg), splits=plan.num_splits, tiles_per_split=plan.tiles_per_split)
    return rep


def gluon_report(name: str, h: int, b: int, k: int = 2048, d_qk: int = 576) -> dict[str, Any]:
    """Compile a Gluon kernel ("warpgroup" or "mmasync") at its default as it launches at H heads, B rows, top-k K
    on a 132-SM H200."""
    import torch

    from mla_kernels import mmasync, warpgroup
    from mla_kernels.launcher import launch_constexprs

    mod, kernel, cfg = {
        "warpgroup": (warpgroup, warpgroup._warpgroup_decode_kernel, warpgroup.WarpgroupConfig()),
        "mmasync": (mmasync, mmasync._mmasync_decode_kernel, mmasync.SyncConfig()),
    }[name]
    plan = mod.plan(torch.empty((b, h, d_qk), device="meta"), k, cfg, slots=132)
    constexprs = launch_constexprs(cfg, plan)
    rep = compile_sm90(kernel, _decode_signature("*bf16"), constexprs, mod.NUM_WARPS, 1)
    rep.update(H=h, B=b, config=asdict(cfg), splits=plan.num_splits, tiles_per_split=plan.tiles_per_split)
    return rep


CONFIGS = ("default", "half-heads", "unpipelined")
SHAPES = ("16x32", "16x128", "128x32")


def main(argv: list[str] | None = None) -> int:
    """Compile the tiled SIMT kernel's configurations at the benchmark's shapes; print one line each."""
    parser = argparse.ArgumentParser(prog="python -m mla_kernels.sass", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the reports here as JSON")
    parser.add_argument("--config", action="append", choices=CONFIGS, help="only these configurations")
    parser.add_argument("--shape", action="append", choices=SHAPES, help="only these heads x batch rows")
    parser.add_argument("--mma", action="store_true", help="instead: the MMA kernel's H = 128 V-split candidate")
    parser.add_argument("--warpgroup", action="store_true", help="instead: the Gluon wgmma kernel at H = 128")
    parser.add_argument("--mmasync", action="store_true", help="instead: the Gluon mma.sync kernel at H = 16")
    args = parser.parse_args(argv)
    from mla_kernels import simt_tiled

    if args.warpgroup:
        rows = [gluon_report("warpgroup", 128, b) | {"name": "warpgroup"} for b in (32, 128)]
    elif args.mmasync:
        rows = [gluon_report("mmasync", 16, b) | {"name": "mmasync"} for b in (32, 128)]
    elif args.mma:
        from mla_kernels.tune import v_split_h128

        rows = [mma_report(128, b, v_split_h128()) | {"name": "v-split"} for b in (32, 128)]
    else:
        configs = {
            "default": simt_tiled.DEFAULT_CONFIG,
            "half-heads": simt_tiled.HALF_HEADS_CONFIG,
            "unpipelined": simt_tiled.UNPIPELINED_CONFIG,
        }
        rows = []
        for name in args.config or CONFIGS:
            for shape in args.shape or SHAPES:
                h, b = (int(x) for x in shape.split("x"))
                rows.append(tiled_report(h, b, configs[name]) | {"name": name})
    for rep in rows:
        print(_line(rep), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _line(rep: dict[str, Any]) -> str:
    """One report as a line: resources, then the per-tile mix (SIMT) or the wgmma shapes (MMA)."""
    t = rep.get("per_tile", {})
    mix = (
        f"per tile: {t['instructions']} instr, {t['FFMA']} FFMA ({100 * t['ffma_share']:.0f}%), {t['prmt_shf']} "
        f"PRMT+SHF, {t['LDS']} LDS"
        if t
        else f"wgmma {','.join(rep['wgmma_shapes']) or '-'}"
    )
    resident = f" programs/SM {rep['programs_per_sm_by_registers']}" if "programs_per_sm_by_registers" in rep else ""
    return (
        f"{rep['name']:<11} H={rep['H']:<3} B={rep['B']:<3} S={rep['splits']:<2} regs {rep['registers']} spill "
        f"{rep['spill_store_bytes']}/{rep['spill_load_bytes']} B stack {rep['stack_bytes']} shared "
        f"{rep['shared_bytes']}{resident}  {mix}; HMMA {rep['ops'].get('HMMA', 0)} HGMMA {rep['ops'].get('HGMMA', 0)}"
    )


if __name__ == "__main__":
    sys.exit(main())
