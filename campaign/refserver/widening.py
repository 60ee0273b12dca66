"""Widening: the same model at DeepSeek's MLA widths, computing the same function.

``python -m campaign.refserver.widening --model-path IN --out OUT [--n-heads 16] [--d-latent 512] [--d-rope 64]
[--index-heads 64] [--index-dim 128]``

A model trained on two CPU cores cannot be trained at the real widths there, yet the server's attention kernels must
run at those widths to be measured. Widening embeds the trained weights in the wider shapes so that every added part
contributes exactly nothing: added heads have zero query and output weights, added latent and indexer dimensions are
zero (their norm gains rescaled so that the RMS over the wider row is the old one), the rope part keeps each old
frequency at the position of the same frequency in the wider row, and the queries are scaled so that the wider
softmax scale gives the old scores. The wide model answers as the narrow one (up to the norms' epsilon), while its
decode runs attention over ``[d_latent | d_rope]`` rows with all of its heads. The added heads then hold zeros, not
learned weights: a GPU can train them in with ``python -m campaign.refserver.train --init OUT ...``
(docs/performance.md has the command).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from campaign.refserver.model import ArithModel, ModelConfig, load_model, save_model


def _rope_rows(old: int, new: int) -> torch.Tensor:
    """Where each of the old rope dimensions goes in the new one (rotate-half layout, frequencies kept)."""
    half_old, half_new = old // 2, new // 2
    step = half_new // half_old
    first = torch.arange(half_old) * step
    return torch.cat([first, first + half_new])


def widen(model: ArithModel, n_heads: int, d_latent: int, d_rope: int, index_heads: int, index_dim: int) -> ArithModel:
    """A model of the wider shapes that computes what ``model`` computes. Raises ValueError for shapes that do
    not contain the old ones (or a rope width whose frequencies do not contain the old ones)."""
    old = model.cfg
    if n_heads < old.n_heads or d_latent < old.d_latent or d_rope < old.d_rope:
        raise ValueError(f"the new shapes must contain the old ones ({old.n_heads} heads, {old.d_latent}+{old.d_rope})")
    if d_rope % 2 or (d_rope // 2) % (old.d_rope // 2):
        raise ValueError(f"--d-rope {d_rope}: half of it must be a multiple of {old.d_rope // 2}")
    if old.has_indexer and (index_heads < old.index_heads or index_dim < old.index_dim):
        raise ValueError(f"the indexer must keep at least {old.index_heads} heads of {old.index_dim}")
    new = replace(
        old,
        n_heads=n_heads,
        d_latent=d_latent,
        d_rope=d_rope,
        index_heads=index_heads if old.has_indexer else 0,
        index_dim=index_dim if old.has_indexer else 0,
    )
    wide = ArithModel(new)
    src = model.state_dict()
    dst = {key: torch.zeros_like(value) for key, value in wide.state_dict().items()}
    rope = _rope_rows(old.d_rope, d_rope)
    # The softmax scale falls from 1/sqrt(old d_qk) to 1/sqrt(new d_qk): queries grow to keep the scores.
    q_gain = math.sqrt(new.d_qk / old.d_qk)
    for key, value in src.items():
        if ".attn." not in key and ".indexer." not in key:
            dst[key] = value.clone()
    for layer in range(old.n_layers):
        p = f"blocks.{layer}.attn."
        d = old.d_model
        q_lat = dst[p + "wq_latent.weight"].view(n_heads, d_latent, d)
        q_lat[: old.n_heads, : old.d_latent] = src[p + "wq_latent.weight"].view(old.n_heads, old.d_latent, d) * q_gain
        q_rope = dst[p + "wq_rope.weight"].view(n_heads, d_rope, d)
        q_rope[: old.n_heads, rope] = src[p + "wq_rope.weight"].view(old.n_heads, old.d_rope, d) * q_gain
        wkv = dst[p + "wkv.weight"]
        wkv[: old.d_latent] = src[p + "wkv.weight"][: old.d_latent]
        wkv[d_latent + rope] = src[p + "wkv.weight"][old.d_latent :]
        # The latent is RMS-normed over d_latent values, of which only the old ones are non-zero.
        gain = dst[p + "kv_norm.weight"]
        gain.fill_(1.0)
        gain[: old.d_latent] = src[p + "kv_norm.weight"] / math.sqrt(d_latent / old.d_latent)
        wo = dst[p + "wo.weight"].view(d, n_heads, d_latent)
        wo[:, : old.n_heads, : old.d_latent] = src[p + "wo.weight"].view(d, old.n_heads, old.d_latent)
        if old.has_indexer:
            _widen_indexer(src, dst, f"blocks.{layer}.indexer.", old, new)
    wide.load_state_dict(dst)
    return wide.eval()


def _widen_indexer(
    src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], p: str, old: ModelConfig, new: ModelConfig
) -> None:
    d = old.d_model
    wq = dst[p + "wq.weight"].view(new.index_heads, new.index_dim, d)
    wq[: old.index_heads, : old.index_dim] = src[p + "wq.weight"].view(old.index_heads, old.index_dim, d)
    dst[p + "wk.weight"][: old.index_dim] = src[p + "wk.weight"]
    ratio = new.index_dim / old.index_dim
    gain = dst[p + "k_norm.weight"]
    gain.fill_(1.0)
    gain[: old.index_dim] = src[p + "k_norm.weight"] / math.sqrt(ratio)
    # Keys came out 1/sqrt(ratio) of the old ones before the gain fix above; the head weights' folded-in scale
    # (1/sqrt(H_I·D_I)) shrinks with the wider indexer: undo it, so that the scores are the old ones.
    dst[p + "ww.weight"][: old.index_heads] = src[p + "ww.weight"] * math.sqrt(
        (new.index_heads * new.index_dim) / (old.index_heads * old.index_dim)
    )


def main(argv: list[str] | None = None) -> int:
    """Widen a weights file; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m campaign.refserver.widening", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", type=Path, required=True, help="the weights file to widen")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n-heads", type=int, default=16)
    parser.add_argument("--d-latent", type=int, default=512)
    parser.add_argument("--d-rope", type=int, default=64)
    parser.add_argument("--index-heads", type=int, default=64)
    parser.add_argument("--index-dim", type=int, default=128)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        model, meta = load_model(args.model_path, "cpu")
        wide = widen(model, args.n_heads, args.d_latent, args.d_rope, args.index_heads, args.index_dim)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    facts = {k: v for k, v in meta.items() if k not in ("config", "model_id")}
    save_model(wide, args.out, {**facts, "widened_from": f"{args.model_path.name} {model.cfg.to_json()}"})
    n_params = sum(p.numel() for p in wide.parameters())
    print(f"wrote {args.out}: {n_params} parameters, config {wide.cfg.to_json()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
