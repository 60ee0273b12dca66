"""The reference server's trained weights rewritten as a DeepSeek-V3 checkpoint (the committed campaign/refserver/hf/).

``python -m campaign.refserver.hf_convert [--weights campaign/refserver/weights/arith.safetensors] --out DIR``

The reference model (campaign/refserver/model.py) is already MLA in its absorbed form: per token one KV row
``[latent 64 | rope 16]`` shared by all heads, queries made directly in that space, the latent as the value. In
DeepSeek-V3's form that is, per layer and exactly:

- ``kv_a_proj_with_mqa``: the latent rows into the first 64 of the 512 latent channels (the rest zero) and the rope
  rows into the 64-wide rope slot; ``kv_a_layernorm`` over 512 channels with the gain scaled by sqrt(64/512) so
  that it normalises like the 64-wide norm;
- ``kv_b_proj``: the identity, for every head, from the latent to its ``k_nope`` (64) and to its value (64);
- ``q_proj``: the reference's latent and rope query rows, scaled by sqrt(128/80) for DeepSeek-V3's softmax scale
  of 1/sqrt(qk_nope + rope) = 1/sqrt(128) instead of 1/sqrt(80);
- rope: the reference's rotate-half pairs ``(i, i + 8)`` at frequency base^(-i/8) are the interleaved pairs
  ``(8i, 8i + 1)`` of the 64-wide slot (frequency base^(-8i/64)); the other 24 pairs stay zero.

The MLP is the one part that is not exact: DeepSeek-V3's is gated, ``down(silu(gate(x)) * up(x))``, the
reference's is ``down(silu(up(x)))``. The residual stream gets one constant channel (``K``, written by the
embedding, never by a layer) so that ``up`` can read a factor near 1 from it: after the pre-MLP RMS norm that
channel is K / rms(x), so each layer's ``up`` weight is that layer's mean rms divided by K (measured on the
table), and the MLP output is the reference's times rms_mean / rms(x) (within about 15% per token). The answers
are robust to that: scored on the whole table afterwards (``campaign.refserver.hf_train --score``). Hidden size
192 + 1 is padded with zero channels to 208, a multiple of 16, with the norm gains scaled for the extra channels.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from campaign.refserver.hf_export import VOCAB_ROWS, build_model, hf_config, save_weights, write_metadata
from campaign.refserver.model import ArithModel, load_model
from campaign.refserver.train import table_tensors

REFERENCE_WEIGHTS = Path(__file__).resolve().parent / "weights" / "arith.safetensors"
HIDDEN = 208  # 192 reference channels, the constant channel, 15 zero channels
CONSTANT = 192  # index of the constant channel
K = 1e-2  # its value: small, so that it moves every RMS norm by a factor 1 - K^2 / (2 * sum x^2), about 1e-6
ROPE = 64  # DeepSeek-V3's rope width (the reference's is 16)
LATENT = 512  # DeepSeek-V3's latent width (the reference's is 64)


def mlp_input_rms(ref: ArithModel, sample: int = 2000, seed: int = 0) -> list[float]:
    """Mean rms of each layer's MLP input over the answer positions of a seeded sample of the table."""
    inputs, _targets, mask = table_tensors("cpu")
    pick = torch.randperm(inputs.shape[0], generator=torch.Generator().manual_seed(seed))[:sample]
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        block.mlp_norm.register_forward_hook(
            lambda _m, args, _out, i=i: seen.__setitem__(i, args[0].pow(2).mean(-1).sqrt())
        )
        for i, block in enumerate(ref.blocks)
    ]
    with torch.no_grad():
        ref(inputs[pick])
    for hook in hooks:
        hook.remove()
    return [float(seen[i][mask[pick]].mean()) for i in range(len(ref.blocks))]


def convert(ref: ArithModel) -> tuple[dict[str, Any], Any, dict[str, str]]:
    """The DeepSeek-V3 config, model (float32) and metadata equivalent to ``ref`` (see the module docstring)."""
    c = ref.cfg
    heads, d_lat, d_rope, d_model = c.n_heads, c.d_latent, c.d_rope, c.d_model
    config = hf_config(
        hidden_size=HIDDEN,
        intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layers,
        num_attention_heads=heads,
        qk_nope_head_dim=d_lat,
        v_head_dim=d_lat,
        qk_rope_head_dim=ROPE,
        kv_lora_rank=LATENT,
        torch_dtype="float32",
    )
    config["rope_theta"] = c.rope_base
    model = build_model(config)
    src = {k: v.float() for k, v in ref.state_dict().items()}
    dst = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    # reference rope index -> slot index in the 64-wide interleaved rope part
    rope_map = [(8 * i, i) for i in range(d_rope // 2)] + [(8 * i + 1, i + d_rope // 2) for i in range(d_rope // 2)]
    q_scale = math.sqrt((d_lat + ROPE) / (d_lat + d_rope))
    up_gain = [rms / (K * math.sqrt(HIDDEN / d_model)) for rms in mlp_input_rms(ref)]

    def norm_gain(w: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(HIDDEN)
        out[:d_model] = w * math.sqrt(d_model / HIDDEN)
        out[CONSTANT] = 1.0
        return out

    dst["model.embed_tokens.weight"][: c.vocab_size, :d_model] = src["embed.weight"]
    dst["model.embed_tokens.weight"][:, CONSTANT] = K
    for layer in range(c.n_layers):
        p, q = f"model.layers.{layer}.", f"blocks.{layer}."
        dst[p + "input_layernorm.weight"] = norm_gain(src[q + "attn_norm.weight"])
        dst[p + "post_attention_layernorm.weight"] = norm_gain(src[q + "mlp_norm.weight"])
        q_proj = dst[p + "self_attn.q_proj.weight"]
        for h in range(heads):
            base = h * (d_lat + ROPE)
            q_proj[base : base + d_lat, :d_model] = src[q + "attn.wq_latent.weight"][h * d_lat : (h + 1) * d_lat]
            for slot, i in rope_map:
                q_proj[base + d_lat + slot, :d_model] = src[q + "attn.wq_rope.weight"][h * d_rope + i]
        q_proj *= q_scale
        kv_a = dst[p + "self_attn.kv_a_proj_with_mqa.weight"]
        kv_a[:d_lat, :d_model] = src[q + "attn.wkv.weight"][:d_lat]
        for slot, i in rope_map:
            kv_a[LATENT + slot, :d_model] = src[q + "attn.wkv.weight"][d_lat + i]
        dst[p + "self_attn.kv_a_layernorm.weight"][:d_lat] = src[q + "attn.kv_norm.weight"] * math.sqrt(d_lat / LATENT)
        kv_b = dst[p + "self_attn.kv_b_proj.weight"]
        for h in range(heads):
            kv_b[h * 2 * d_lat : h * 2 * d_lat + d_lat, :d_lat] = torch.eye(d_lat)
            kv_b[h * 2 * d_lat + d_lat : (h + 1) * 2 * d_lat, :d_lat] = torch.eye(d_lat)
        dst[p + "self_attn.o_proj.weight"][:d_model] = src[q + "attn.wo.weight"]
        dst[p + "mlp.gate_proj.weight"][:, :d_model] = src[q + "up.weight"]
        dst[p + "mlp.up_proj.weight"][:, CONSTANT] = up_gain[layer]
        dst[p + "mlp.down_proj.weight"][:d_model] = src[q + "down.weight"]
    dst["model.norm.weight"] = norm_gain(src["norm.weight"])
    dst["lm_head.weight"][: c.vocab_size, :d_model] = src["head.weight"]
    # Rows past the tokenizer's vocabulary (padding to VOCAB_ROWS) read the constant channel: never the argmax.
    dst["lm_head.weight"][c.vocab_size : VOCAB_ROWS, CONSTANT] = -1e4
    model.load_state_dict(dst)
    meta = {"converted_from": "campaign/refserver/weights/arith.safetensors", "up_gain": json.dumps(up_gain)}
    return config, model.eval(), meta


def main(argv: list[str] | None = None) -> int:
    """Command line: write the converted checkpoint folder; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m campaign.refserver.hf_convert", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--weights", type=Path, default=REFERENCE_WEIGHTS, help="the reference server's weights")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        ref, ref_meta = load_model(args.weights, "cpu")
    except (OSError, ValueError) as e:
        print(f"error: --weights {args.weights}: {e}", file=sys.stderr)
        return 2
    config, model, meta = convert(ref)
    write_metadata(args.out, config)
    keep = {k: ref_meta[k] for k in ("steps", "exact_accuracy", "device", "torch", "seed") if k in ref_meta}
    save_weights(model, args.out, {**meta, **{f"reference_{k}": v for k, v in keep.items()}}, dtype="float32")
    print(f"wrote {args.out} (up gains {meta['up_gain']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
