"""The arithmetic model: a small decoder whose attention is MLA-shaped like DeepSeek's.

Per token each layer keeps one compressed KV row shared by all heads: a latent part (``d_latent``, normalised) and
a rope part (``d_rope``). Queries are produced directly in that space (the "absorbed" form of MLA), so attention
is multi-query attention over rows ``[latent | rope]`` whose latent part is also the value. Decode is therefore
exactly ``kernels.sparse_mla_decode`` over the KV pool with every cached token of the request selected.

Three entry points share the same layers: ``forward`` (training: full causal attention over a batch),
``prefill`` (the same, also writing each layer's KV rows into the pool) and ``decode`` (one token per request,
attention through the kernels package).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from campaign.refserver.tokenizer import VOCAB_SIZE


# The KV write as an op that says it mutates the pool. Written as `pool[layer].index_copy_(...)` inside the compiled
# decode step, functionalization turned it into an out-of-place copy of the whole layer slice: on the H200, with the
# pool sized by the default memory fraction, that was a 30.6 GiB temporary and torch.compile variants died of OOM
# (campaign diagnosed it; see docs/gpu.md). A custom op with `mutates_args` is re-inplaced by Inductor.
@torch.library.custom_op("refserver::write_kv", mutates_args=("pool",))
def write_kv(pool: torch.Tensor, layer: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
    """Write ``kv [n, d_qk]`` to ``pool[layer, slots]`` in place."""
    pool[layer].index_copy_(0, slots, kv.to(pool.dtype))


@write_kv.register_fake
def _write_kv_fake(pool: torch.Tensor, layer: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
    return None


MODEL_ID = "campaign-arith-mla"


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of the model; stored as JSON in the weights file's metadata."""

    vocab_size: int = VOCAB_SIZE
    d_model: int = 192
    n_layers: int = 4
    n_heads: int = 4
    d_latent: int = 64
    d_rope: int = 16
    d_ff: int = 576
    context_len: int = 64
    rope_base: float = 10000.0

    @property
    def d_qk(self) -> int:
        """Width of one KV row (and of one query head): latent then rope."""
        return self.d_latent + self.d_rope

    @property
    def sm_scale(self) -> float:
        """Softmax scale of the attention scores."""
        return 1.0 / math.sqrt(self.d_qk)

    def to_json(self) -> str:
        """The config as a JSON string."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        """Parse a config written by ``to_json``; unknown keys are an error."""
        return cls(**json.loads(text))


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate the last dimension of ``x`` by ``positions`` (rotate-half form); positions broadcast over heads.

    Angles are computed from the positions tensor itself so the op is shape-static under CUDA graphs.
    """
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    while angles.dim() < x.dim():
        angles = angles.unsqueeze(-2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MLAttention(nn.Module):
    """Attention over compressed KV rows ``[latent | rope]`` shared by all heads."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wq_latent = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_latent, bias=False)
        self.wq_rope = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_rope, bias=False)
        self.wkv = nn.Linear(cfg.d_model, cfg.d_latent + cfg.d_rope, bias=False)
        self.kv_norm = RMSNorm(cfg.d_latent)
        self.wo = nn.Linear(cfg.n_heads * cfg.d_latent, cfg.d_model, bias=False)

    def project(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries ``[..., H, d_qk]`` and KV rows ``[..., d_qk]`` of hidden states ``h [..., d_model]``."""
        cfg = self.cfg
        lead = h.shape[:-1]
        q_lat = self.wq_latent(h).view(*lead, cfg.n_heads, cfg.d_latent)
        q_rope = apply_rope(self.wq_rope(h).view(*lead, cfg.n_heads, cfg.d_rope), positions, cfg.rope_base)
        kv = self.wkv(h)
        latent = self.kv_norm(kv[..., : cfg.d_latent])
        k_rope = apply_rope(kv[..., cfg.d_latent :], positions, cfg.rope_base)
        return torch.cat([q_lat, q_rope], dim=-1), torch.cat([latent, k_rope], dim=-1)

    def causal(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Full causal attention: q ``[B, T, H, d_qk]``, kv ``[B, T, d_qk]`` -> ``[B, T, H*d_latent]``."""
        cfg = self.cfg
        b, t = q.shape[0], q.shape[1]
        scores = torch.einsum("bthd,bsd->bhts", q, kv) * cfg.sm_scale
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.einsum("bhts,bsd->bthd", scores.softmax(dim=-1), kv[..., : cfg.d_latent])
        return out.reshape(b, t, cfg.n_heads * cfg.d_latent)


class Block(nn.Module):
    """Pre-norm decoder block: MLA attention, then a SiLU MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = MLAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The residual MLP branch."""
        return self.down(F.silu(self.up(self.mlp_norm(x))))


class ArithModel(nn.Module):
    """The decoder. See the module docstring for its three entry points."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(
        self,
        tokens: torch.Tensor,
        pool: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` of right-padded ``tokens [B, T]`` with causal attention.

        With ``pool [L, N, d_qk]`` and ``slots [B, T]`` (int64), each layer's KV rows are also written to
        ``pool[layer, slots]`` (prefill). Right padding is harmless: a real position never attends to a later one.
        """
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).expand(b, t)
        x = self.embed(tokens)
        for layer, block in enumerate(self.blocks):
            q, kv = block.attn.project(block.attn_norm(x), positions)
            if pool is not None and slots is not None:
                write_kv(pool, layer, slots.reshape(-1), kv.reshape(b * t, -1))
            x = x + block.attn.wo(block.attn.causal(q, kv))
            x = x + block.mlp(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        pool: torch.Tensor,
        out_slots: torch.Tensor,
        indices: torch.Tensor,
        backend: str,
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of one new token per request.

        ``tokens``/``positions``/``out_slots`` are ``[B]`` (the new token's id, position and pool slot);
        ``indices [B, K]`` int32 lists every cached slot of the request including ``out_slots`` (-1 pads).
        """
        from kernels import sparse_mla_decode

        cfg = self.cfg
        b = tokens.shape[0]
        x = self.embed(tokens)
        for layer, block in enumerate(self.blocks):
            q, kv = block.attn.project(block.attn_norm(x), positions)
            write_kv(pool, layer, out_slots, kv)
            out, _lse = sparse_mla_decode(
                q.to(pool.dtype), pool[layer], indices, cfg.sm_scale, backend, d_v=cfg.d_latent
            )
            x = x + block.attn.wo(out.reshape(b, cfg.n_heads * cfg.d_latent).to(x.dtype))
            x = x + block.mlp(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def save_model(model: ArithModel, path: Path, meta: dict[str, Any]) -> None:
    """Write the weights as safetensors with the config (and ``meta``, e.g. training facts) in the metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    metadata = {"config": model.cfg.to_json(), "model_id": MODEL_ID, **{k: str(v) for k, v in meta.items()}}
    save_file(tensors, str(path), metadata=metadata)


def load_model(path: Path, device: str) -> tuple[ArithModel, dict[str, str]]:
    """Load a weights file written by ``save_model``; returns the model in eval mode and the file's metadata.

    Raises ``ValueError`` when the file is not such a weights file.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        metadata: dict[str, str] = dict(handle.metadata() or {})
    if "config" not in metadata:
        raise ValueError(f"{path} has no model config in its metadata: not a weights file of this model")
    cfg = ModelConfig.from_json(metadata["config"])
    model = ArithModel(cfg)
    model.load_state_dict(load_file(str(path)))
    return model.to(device).eval(), metadata
