"""The arithmetic model: a small decoder whose attention is MLA-shaped like DeepSeek's.

Per token each layer keeps one compressed KV row shared by all heads: a latent part (``d_latent``, normalised) and
a rope part (``d_rope``). Queries are produced directly in that space (the "absorbed" form of MLA), so attention
is multi-query attention over rows ``[latent | rope]`` whose latent part is also the value. Decode is therefore
exactly ``mla_kernels.sparse_mla_decode`` over the KV pool with every cached token of the request selected.

Two entry points share the same layers: ``forward`` (causal attention over a batch: training, and prefill when
it also writes each layer's KV rows into the pool) and ``decode`` (one token per request, attention through the
mla_kernels package).

A long-context model (``index_heads > 0``) also has a lightning indexer per layer, as DeepSeek V3.2 does: a few small
heads score every cached token (``Σ_h w_h·ReLU(q_h·k)``), and attention then runs over the ``topk`` best-scored
tokens only. In decode the scores and the top-k are mla_kernels' indexer (``aware``: work bounded by the row's own
length; ``naive``: the O(max_context) form); in prefill the same scores mask the causal attention to each query's
top-k. Unlike DeepSeek's, this indexer has no rope part: it selects by content alone, so its choice does not depend
on how far a token is, and it carries over to contexts longer than those it was trained on.
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

from campaign.refserver.fault import apply_fault
from campaign.refserver.tokenizer import VOCAB_SIZE


# The KV write as an op that says it mutates the pool. Written as `pool[layer].index_copy_(...)` inside the compiled
# decode step, functionalization turned it into an out-of-place copy of the whole layer slice: on the H200, with the
# pool sized by the default memory fraction, that was a 30.6 GiB temporary and torch.compile variants died of OOM
# (campaign diagnosed it; see docs/gpu.md). A custom op with `mutates_args` is re-inplaced by Inductor.
@torch.library.custom_op("refserver::write_kv", mutates_args=("pool",))
def write_kv(pool: torch.Tensor, layer: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
    """Write ``kv [n, d_qk]`` to ``pool[layer, slots]`` in place (quantised first when the pool holds FP8 rows)."""
    if pool.dtype == torch.uint8:
        from mla_kernels import fp8cache

        d_v, _tiles = fp8cache.split_row(kv.shape[1], pool.shape[2])
        pool[layer].index_copy_(0, slots, fp8cache.quantize(kv, d_v))
        return
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
    #: The lightning indexer: heads and width of its scores (0 heads: no indexer, decode attends to every token),
    #: and how many tokens it keeps unless the server is told otherwise.
    index_heads: int = 0
    index_dim: int = 0
    index_topk: int = 0

    @property
    def d_qk(self) -> int:
        """Width of one KV row (and of one query head): latent then rope."""
        return self.d_latent + self.d_rope

    @property
    def has_indexer(self) -> bool:
        """Whether attention runs over the indexer's top-k (a long-context model) rather than every token."""
        return self.index_heads > 0

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

    def causal(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        keep: torch.Tensor | None = None,
        probs: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Causal attention: q ``[B, T, H, d_qk]``, kv ``[B, T, d_qk]`` -> ``[B, T, H*d_latent]``.

        ``keep [B, T, T]`` (bool), when given, further limits each query to the keys it marks (the indexer's top-k).
        With ``probs`` a list, the attention weights averaged over heads ``[B, T, T]`` are appended to it (training).
        Queries go in chunks whose score tensor stays near ``ATTENTION_CHUNK`` elements, so a long prefill does not
        hold a [B, H, T, T] tensor at once.
        """
        cfg = self.cfg
        b, t = q.shape[0], q.shape[1]
        step = max(1, ATTENTION_CHUNK // max(1, b * cfg.n_heads * t))
        outs: list[torch.Tensor] = []
        for lo in range(0, t, step):
            hi = min(t, lo + step)
            scores = torch.einsum("bthd,bsd->bhts", q[:, lo:hi], kv) * cfg.sm_scale
            allowed = causal_mask(lo, hi, t, q.device)[None, None]
            if keep is not None:
                allowed = allowed & keep[:, None, lo:hi]
            weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            if probs is not None:
                probs.append(weights.mean(dim=1))
            outs.append(torch.einsum("bhts,bsd->bthd", weights, kv[..., : cfg.d_latent]))
        return torch.cat(outs, dim=1).reshape(b, t, cfg.n_heads * cfg.d_latent)


#: Score elements one chunk of causal attention may hold (2^26 fp32 values: 256 MiB).
ATTENTION_CHUNK = 1 << 26


def causal_mask(lo: int, hi: int, t: int, device: torch.device) -> torch.Tensor:
    """``[hi - lo, t]`` bool: query ``lo + i`` may see key ``j`` when ``j <= lo + i``."""
    rows = torch.arange(lo, hi, device=device)[:, None]
    return torch.arange(t, device=device)[None, :] <= rows


class Indexer(nn.Module):
    """The lightning indexer of one layer: ``index_heads`` query heads of ``index_dim`` values, one key per token."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.d_model, cfg.index_heads * cfg.index_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.index_dim, bias=False)
        self.k_norm = RMSNorm(cfg.index_dim)
        self.ww = nn.Linear(cfg.d_model, cfg.index_heads, bias=False)

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[..., H_I, D_I]``, head weights ``[..., H_I]`` (scales folded in) and keys ``[..., D_I]``."""
        cfg = self.cfg
        q = self.wq(h).view(*h.shape[:-1], cfg.index_heads, cfg.index_dim)
        w = self.ww(h) * (cfg.index_heads**-0.5 * cfg.index_dim**-0.5)
        return q, w, self.k_norm(self.wk(h))

    @staticmethod
    def scores(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``[B, T, S]``: query t's score of key s, ``Σ_h w[t, h]·ReLU(q[t, h]·k[s])`` (mla_kernels' formula)."""
        # A head at a time: the [B, T, H_I, S] product at once would be H_I times the size of the result.
        total = torch.zeros(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype, device=q.device)
        for head in range(q.shape[2]):
            total = total + w[..., head, None] * torch.bmm(q[:, :, head], k.transpose(1, 2)).clamp(min=0)
        return total


def topk_keep(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """``[B, T, S]`` bool: for each query, its ``topk`` best-scored keys among those it may see (all when fewer)."""
    t = scores.shape[1]
    masked = scores.masked_fill(~causal_mask(0, t, scores.shape[2], scores.device)[None], float("-inf"))
    if topk >= scores.shape[2]:
        return torch.isfinite(masked)
    chosen = masked.topk(topk, dim=-1).indices
    keep = torch.zeros_like(masked, dtype=torch.bool).scatter_(-1, chosen, True)
    return keep & torch.isfinite(masked)


@dataclass
class IndexPool:
    """What decode needs for the indexer: its key cache ``[n_layers, slots, D_I]``, the per-slot key scales
    ``[slots]`` (ones here), which form of mla_kernels' indexer runs and how many tokens it keeps."""

    keys: torch.Tensor
    k_scale: torch.Tensor
    mode: str
    topk: int
    #: The aware form's top-k kernel (``mla_kernels.indexer_topk``'s ``method``: auto, single or split).
    topk_method: str = "auto"


#: The indexer's two forms in decode: mla_kernels' O(context) one, and the O(max_context) one a campaign must catch.
INDEXER_MODES = ("aware", "naive")


class Block(nn.Module):
    """Pre-norm decoder block: MLA attention, then a SiLU MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = MLAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.indexer = Indexer(cfg) if cfg.has_indexer else None

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
        *,
        index_keys: torch.Tensor | None = None,
        topk: int | None = None,
        aux: Aux | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` of right-padded ``tokens [B, T]`` with causal attention.

        With ``pool [L, N, d_qk]`` and ``slots [B, T]`` (int64), each layer's KV rows are also written to
        ``pool[layer, slots]`` (prefill), and the indexer's keys to ``index_keys[layer, slots]`` when the model has
        one. Right padding is harmless: a real position never attends to a later one. With an indexer, each query
        attends to its ``topk`` (default: the config's) best-scored keys only. ``aux`` collects, per layer, the
        indexer's scores and the attention weights it learns from (training).
        """
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).expand(b, t)
        k = self.cfg.index_topk if topk is None else topk
        x = self.embed(tokens)
        for layer, block in enumerate(self.blocks):
            h = block.attn_norm(x)
            q, kv = block.attn.project(h, positions)
            keep: torch.Tensor | None = None
            if block.indexer is not None:
                # The indexer learns from the attention, not the other way round: its input is cut from the graph.
                iq, iw, ik = block.indexer.project(h.detach() if aux is not None else h)
                scores = Indexer.scores(iq, iw, ik)
                if aux is not None:
                    aux.index_scores.append(scores)
                elif k < t:
                    keep = topk_keep(scores, k)
                if pool is not None and slots is not None and index_keys is not None:
                    write_kv(index_keys, layer, slots.reshape(-1), ik.reshape(b * t, -1))
            if pool is not None and slots is not None:
                write_kv(pool, layer, slots.reshape(-1), kv.reshape(b * t, -1))
            probs = aux.attention if aux is not None else None
            x = x + block.attn.wo(block.attn.causal(q, kv, keep, probs))
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
        fault: str | None = None,
        index: IndexPool | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of one new token per request.

        ``tokens``/``positions``/``out_slots`` are ``[B]`` (the new token's id, position and pool slot). Without an
        indexer, ``indices [B, K]`` int32 lists every cached slot of the request including ``out_slots`` (-1 pads).
        With one (``index`` given), ``indices`` is the request's page table ``[B, P]`` int32 (64 slots a page, the
        row's length being ``position + 1``) and each layer's indexer picks the ``index.topk`` slots attended to.
        ``fault`` names a deliberate attention fault (``campaign.refserver.fault``); None in normal use.
        """
        cfg = self.cfg
        b = tokens.shape[0]
        lengths = (positions + 1).to(torch.int32)
        x = self.embed(tokens)
        for layer, block in enumerate(self.blocks):
            h = block.attn_norm(x)
            q, kv = block.attn.project(h, positions)
            write_kv(pool, layer, out_slots, kv)
            selected = indices
            if index is not None and block.indexer is not None:
                iq, iw, ik = block.indexer.project(h)
                write_kv(index.keys, layer, out_slots, ik)
                selected = select_slots(index, layer, iq, iw, indices, lengths)
            # An FP8 pool (uint8 rows) takes q in the model's dtype; otherwise q is cast to the pool's.
            q = q.to(x.dtype if pool.dtype == torch.uint8 else pool.dtype)
            out, _lse = mla_decode_op(q, pool[layer], selected, cfg.sm_scale, backend, cfg.d_latent)
            out = apply_fault(fault, out)
            x = x + block.attn.wo(out.reshape(b, cfg.n_heads * cfg.d_latent).to(x.dtype))
            x = x + block.mlp(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


@dataclass
class Aux:
    """Per-layer training extras of ``ArithModel.forward``: the indexer's scores and the attention weights."""

    index_scores: list[torch.Tensor]
    attention: list[torch.Tensor]


def select_slots(
    index: IndexPool, layer: int, q: torch.Tensor, w: torch.Tensor, page_table: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """``[B, topk]`` int32: the KV slots this layer's indexer keeps for each row (-1 pads), by ``index.mode``."""
    keys = index.keys[layer]
    slots: torch.Tensor = index_topk_op(
        index.mode, q.to(keys.dtype), w.float(), keys, index.k_scale, page_table, lengths, index.topk, index.topk_method
    )
    return slots


# The indexer and the attention as opaque ops under torch.compile, as SGLang registers its attention: traced through,
# their Triton launches and the buffers those write made Inductor fail to schedule the long-context model's decode
# step (``InductorError: KeyError: 'op30'``, torch 2.11 on the H200), so its compiled variants could not start.
@torch.library.custom_op("refserver::mla_decode", mutates_args=())
def mla_decode_op(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, backend: str, d_v: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mla_kernels.sparse_mla_decode`` with ``backend``: (out ``[B, H, d_v]`` in q's dtype, lse ``[B, H]`` fp32).

    A uint8 ``kv`` holds FP8 rows: ``mla_kernels.fp8cache.decode`` reads them."""
    if kv.dtype == torch.uint8:
        from mla_kernels import fp8cache

        return fp8cache.decode(q, kv, indices, sm_scale, backend, d_v=d_v)
    from mla_kernels import sparse_mla_decode

    out, lse = sparse_mla_decode(q, kv, indices, sm_scale, backend, d_v=d_v)
    return out, lse


@mla_decode_op.register_fake
def _mla_decode_fake(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, backend: str, d_v: int
) -> tuple[torch.Tensor, torch.Tensor]:
    b, h = q.shape[0], q.shape[1]
    return q.new_empty((b, h, d_v)), q.new_empty((b, h), dtype=torch.float32)


@torch.library.custom_op("refserver::index_topk", mutates_args=())
def index_topk_op(
    mode: str,
    q: torch.Tensor,
    w: torch.Tensor,
    keys: torch.Tensor,
    k_scale: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    method: str,
) -> torch.Tensor:
    """mla_kernels' indexer in its ``mode`` form (``aware`` or ``naive``): ``[B, topk]`` int32 KV slots; the aware
    form selects with top-k kernel ``method``."""
    from mla_kernels import lightning_indexer, naive_indexer_topk

    if mode == "aware":
        slots: torch.Tensor = lightning_indexer(q, w, keys, k_scale, page_table, lengths, topk, topk_method=method)
    else:
        slots = naive_indexer_topk(q, w, keys, k_scale, page_table, lengths, topk)
    return slots


@index_topk_op.register_fake
def _index_topk_fake(
    mode: str,
    q: torch.Tensor,
    w: torch.Tensor,
    keys: torch.Tensor,
    k_scale: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    method: str,
) -> torch.Tensor:
    return q.new_empty((q.shape[0], topk), dtype=torch.int32)


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
