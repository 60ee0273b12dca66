"""The arithmetic model as a standard Hugging Face checkpoint (DeepSeek-V3 architecture, character-level tokenizer).

A checkpoint folder holds what any Hugging Face-compatible server loads without our code: ``config.json``
(``DeepseekV3ForCausalLM``: MLA with a 512-wide latent and a 64-wide rope part, the widths FlashMLA serves; every
layer dense), ``model.safetensors``, ``tokenizer.json`` (the ``tokenizers`` library's format: one token per
character, the same ids as :mod:`campaign.refserver.tokenizer`), ``tokenizer_config.json``, ``chat_template.jinja``
and ``generation_config.json``.

``python -m campaign.refserver.hf_export --out DIR [--weights model.safetensors] [--v-head-dim N] [--seed S]``
writes a folder; without ``--weights`` the model is randomly initialised (a real model that loads, serves and
answers wrong). The committed checkpoint, :data:`CHECKPOINT`, is the reference server's trained weights rewritten
by ``campaign.refserver.hf_convert``; ``campaign.refserver.hf_train`` trains :data:`SHAPES` from scratch instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from campaign.refserver.tokenizer import BOS, EOS, PAD, SEP, UNK, VOCAB_SIZE, decode_ids

CHECKPOINT = Path(__file__).resolve().parent / "hf"
MODEL_ID = "campaign-arith-deepseek-v3"

SPECIAL_TOKENS = {PAD: "<pad>", BOS: "<s>", SEP: "<sep>", EOS: "</s>", UNK: "<unk>"}

# The model answers a bare "What is A×B?" (the form it was trained on). Chat clients and smoke checks wrap the
# question in instructions ("Reply with only the number."), so the template keeps the last user message's
# "What is ...?" and drops the rest; a message without one is passed whole.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(text='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{%- if message['content'] is string -%}{%- set ns.text = message['content'] -%}"
    "{%- else -%}{%- set ns.text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set text = ns.text -%}"
    "{%- set at = text.find('What is') -%}"
    "{%- if at >= 0 and '?' in text[at:] -%}{%- set text = text[at:].split('?')[0] + '?' -%}{%- endif -%}"
    "<s>{{ text }}<sep>"
)


def vocab() -> dict[str, int]:
    """Token string to id: the specials, then one token per character (ids as in the reference tokenizer)."""
    table = {name: i for i, name in SPECIAL_TOKENS.items()}
    table.update({decode_ids([i]): i for i in range(len(SPECIAL_TOKENS), VOCAB_SIZE)})
    return table


# Shapes of a model trained from scratch (hf_train; the converted checkpoint keeps the reference model's own).
# Latent 512 and rope 64 are DeepSeek-V3's (the widths FlashMLA kernels are built for); 8 heads, qk_nope 32 and a
# small hidden size keep the file near 10 MB. v_head_dim equals the query head width (nope + rope): transformers
# releases whose paged cache stores expanded keys and values (`serve --continuous-batching`) need one shape for both.
SHAPES: dict[str, Any] = {
    "hidden_size": 192,
    "intermediate_size": 576,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 96,
    "q_lora_rank": None,
}
VOCAB_ROWS = 128  # embedding rows: the 101 tokens, padded to a multiple of 64 as inference engines like


def hf_config(**overrides: Any) -> dict[str, Any]:
    """The ``config.json`` of the exported model (``overrides`` replace entries of :data:`SHAPES`)."""
    shapes = {**SHAPES, **overrides}
    dtype = shapes.pop("torch_dtype", "bfloat16")
    layers = int(shapes["num_hidden_layers"])
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB_ROWS,
        **shapes,
        "num_key_value_heads": shapes["num_attention_heads"],
        # Every layer dense: no expert is ever routed to, but the MoE fields stay valid for engines that read them.
        "first_k_dense_replace": layers,
        "moe_layer_freq": 1,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 0,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_interleave": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "torch_dtype": dtype,
        "use_cache": True,
    }


def tokenizer_json() -> str:
    """``tokenizer.json``: a BPE model with no merges (so every character is one token) and a fusing decoder."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tok = Tokenizer(models.BPE(vocab=vocab(), merges=[], unk_token=SPECIAL_TOKENS[UNK]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(
        [AddedToken(SPECIAL_TOKENS[i], special=True, normalized=False) for i in sorted(SPECIAL_TOKENS)]
    )
    return str(tok.to_str(pretty=True))


def tokenizer_config() -> dict[str, Any]:
    """``tokenizer_config.json``: the fast tokenizer class, its special tokens, and no automatic bos or eos."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[BOS],
        "eos_token": SPECIAL_TOKENS[EOS],
        "pad_token": SPECIAL_TOKENS[PAD],
        "unk_token": SPECIAL_TOKENS[UNK],
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 256,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def generation_config() -> dict[str, Any]:
    """``generation_config.json``: greedy by default, stop at eos."""
    return {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False, "max_new_tokens": 8}


def write_metadata(out: Path, config: dict[str, Any]) -> None:
    """Every file of the checkpoint folder except the weights."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation_config(), indent=2) + "\n")
    (out / "tokenizer.json").write_text(tokenizer_json() + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({k: tokenizer_config()[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}) + "\n"
    )


def build_model(config: dict[str, Any], seed: int = 0) -> Any:
    """A randomly initialised ``DeepseekV3ForCausalLM`` of ``config`` (float32)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    return DeepseekV3ForCausalLM(DeepseekV3Config(**config)).float()


def save_weights(model: Any, out: Path, metadata: dict[str, str] | None = None, dtype: str = "bfloat16") -> Path:
    """Write ``model``'s weights as ``out/model.safetensors`` in ``dtype`` (the checkpoint's) and return the path."""
    import torch
    from safetensors.torch import save_file

    kind = getattr(torch, dtype)
    state = {k: v.detach().to("cpu", kind).contiguous() for k, v in model.state_dict().items()}
    path = out / "model.safetensors"
    save_file(state, str(path), metadata={"format": "pt", **(metadata or {})})
    return path


def export(out: Path, *, weights: Path | None = None, seed: int = 0, **overrides: Any) -> Path:
    """Write a complete checkpoint folder to ``out`` (random weights unless ``weights`` names a safetensors file)."""
    import shutil

    config = hf_config(**overrides)
    write_metadata(out, config)
    if weights is not None:
        if weights.resolve() != (out / "model.safetensors").resolve():
            shutil.copyfile(weights, out / "model.safetensors")
    else:
        save_weights(build_model(config, seed), out, {"trained": "no", "seed": str(seed)})
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: write a checkpoint folder; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m campaign.refserver.hf_export", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    parser.add_argument("--weights", type=Path, help="a model.safetensors to use (default: random initialisation)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--v-head-dim", type=int, help="override v_head_dim (default: the query head width)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.weights is not None and not args.weights.is_file():
        print(f"error: --weights {args.weights}: no such file", file=sys.stderr)
        return 2
    overrides = {} if args.v_head_dim is None else {"v_head_dim": args.v_head_dim}
    export(args.out, weights=args.weights, seed=args.seed, **overrides)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
