"""Train the arithmetic model on the whole question table and write its weights.

``python -m campaign.refserver.train --out PATH [--device cuda] [--steps N] [--seed S] [--time-limit SECONDS]``

Every step samples a batch from the 50,000-question table; the loss covers only the answer characters and ``eos``.
Every ``--eval-every`` steps the whole table is scored teacher-forced: a question counts as exact when the argmax
at every answer position is the right character, which is exactly when greedy decoding reproduces the answer.
Training stops at 100% exact, at ``--steps``, or at ``--time-limit`` (the learning rate anneals over whichever
comes first), and the best checkpoint is written. ``--steps 0`` writes the untrained model at once: a real model
that answers wrong.

A long-context model: ``--filler-max N`` puts up to N characters of filler words before each question
(``questions.long_context_text``; a quarter of the batch has none, so bare questions stay exact), ``--index-heads``
gives it a lightning indexer, trained beside it to predict where each layer's attention goes (the KL divergence from
the attention weights, averaged over heads, to the softmax of the indexer's scores, DeepSeek V3.2's dense warm-up
loss; or, with ``--index-target question``, to rank the tokens that are not filler above those that are).
``--init FILE`` starts from a weights file of the same attention shapes (an indexer it lacks starts fresh).
The score is then taken over a fixed sample of ``--eval-questions`` questions with fillers of every length up to N.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from campaign.refserver.model import ArithModel, Aux, ModelConfig, load_model, save_model
from campaign.refserver.questions import Question, filler_text, long_context_text, question_table
from campaign.refserver.tokenizer import EOS, PAD, encode_prompt, encode_text

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def table_tensors(device: str) -> Batch:
    """The whole table as (inputs [Q, T], targets [Q, T], loss mask [Q, T]) right-padded with ``PAD``."""
    return question_tensors([(q, "") for q in question_table()], device)


def question_tensors(items: Sequence[tuple[Question, str]], device: str) -> Batch:
    """(inputs, targets, loss mask) of questions each after its filler (``""`` for none), right-padded."""
    seqs: list[list[int]] = []
    starts: list[int] = []
    for question, filler in items:
        prompt = encode_prompt(long_context_text(question.text, filler))
        seqs.append(prompt + encode_text(str(question.answer)) + [EOS])
        starts.append(len(prompt) - 1)  # the position whose next-token target is the first answer character
    width = max(len(s) for s in seqs)
    full = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for i, seq in enumerate(seqs):
        full[i, : len(seq)] = torch.tensor(seq)
    inputs, targets = full[:, :-1], full[:, 1:]
    pos = torch.arange(width - 1)[None, :]
    lengths = torch.tensor([len(s) for s in seqs])[:, None]
    mask = (pos >= torch.tensor(starts)[:, None]) & (pos < lengths - 1)
    return inputs.to(device), targets.to(device), mask.to(device)


def filler_items(
    rng: random.Random, table: Sequence[Question], count: int, filler_max: int
) -> list[tuple[Question, str]]:
    """``count`` questions drawn by ``rng``, a quarter bare and the rest after 1..``filler_max`` filler characters."""
    items: list[tuple[Question, str]] = []
    for _ in range(count):
        question = table[rng.randrange(len(table))]
        n = 0 if rng.random() < 0.25 else rng.randint(1, filler_max)
        items.append((question, filler_text(rng, n)))
    return items


@torch.no_grad()
def exact_accuracy(
    model: ArithModel, inputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, chunk: int = 4096
) -> float:
    """Fraction of questions whose every answer position is predicted right (teacher-forced argmax)."""
    model.eval()
    exact = 0
    for lo in range(0, inputs.shape[0], chunk):
        pred = model(inputs[lo : lo + chunk]).argmax(-1)
        wrong = (pred != targets[lo : lo + chunk]) & mask[lo : lo + chunk]
        exact += int((~wrong.any(dim=1)).sum())
    model.train()
    return exact / inputs.shape[0]


def indexer_loss(aux: Aux, valid: torch.Tensor) -> torch.Tensor:
    """Mean over layers and real query positions of KL(attention weights || softmax(indexer scores)), less its
    constant part (the attention's own entropy): ``-Σ_s p[t, s]·log q[t, s]``."""
    total = torch.zeros((), device=valid.device)
    t = valid.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()[None]
    for scores, probs in zip(aux.index_scores, aux.attention, strict=True):
        logq = torch.log_softmax(scores.masked_fill(~causal, float("-inf")), dim=-1).masked_fill(~causal, 0.0)
        per_query = -(probs.detach() * logq).sum(-1)
        total = total + (per_query * valid).sum() / valid.sum()
    return total / max(1, len(aux.index_scores))


def question_index_loss(aux: Aux, inputs: torch.Tensor) -> torch.Tensor:
    """Mean over layers and question positions of the cross-entropy from a uniform target over the keys that are
    not filler (bos, then the question and what follows it) to the softmax of the indexer's scores.

    The question starts after the prompt's last ``.`` (the filler has none; ``questions.long_context_text``).
    """
    t = inputs.shape[1]
    pos = torch.arange(t, device=inputs.device)[None, :]
    dots = torch.where(inputs == encode_text(".")[0], pos, torch.zeros_like(pos))
    start = dots.max(dim=1, keepdim=True).values  # 0 for a bare question: every key is then relevant
    relevant = ((pos > start) | (pos == 0)) & (inputs != PAD)  # [B, T] keys
    queries = (pos > start) & (inputs != PAD)
    causal = torch.ones(t, t, dtype=torch.bool, device=inputs.device).tril()[None]
    target = (relevant[:, None, :] & causal).float()
    target = target / target.sum(-1, keepdim=True).clamp(min=1)
    total = torch.zeros((), device=inputs.device)
    for scores in aux.index_scores:
        logq = torch.log_softmax(scores.masked_fill(~causal, float("-inf")), dim=-1).masked_fill(~causal, 0.0)
        per_query = -(target * logq).sum(-1)
        total = total + (per_query * queries).sum() / queries.sum().clamp(min=1)
    return total / max(1, len(aux.index_scores))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m campaign.refserver.train", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the .safetensors file")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=12000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=300.0, help="hard cap on training seconds")
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--d-model", type=int, default=ModelConfig.d_model)
    parser.add_argument("--d-ff", type=int, default=ModelConfig.d_ff)
    parser.add_argument("--n-layers", type=int, default=ModelConfig.n_layers)
    parser.add_argument("--n-heads", type=int, default=ModelConfig.n_heads)
    parser.add_argument("--d-latent", type=int, default=ModelConfig.d_latent)
    parser.add_argument("--d-rope", type=int, default=ModelConfig.d_rope)
    parser.add_argument("--context-len", type=int, default=None, help="longest request the server takes")
    parser.add_argument("--index-heads", type=int, default=0, help="lightning indexer heads (0: none)")
    parser.add_argument("--index-dim", type=int, default=16, help="width of the indexer's scores (a power of 2)")
    parser.add_argument("--index-topk", type=int, default=2048, help="tokens the indexer keeps (the server's default)")
    parser.add_argument("--index-loss", type=float, default=1.0, help="weight of the indexer's loss")
    parser.add_argument(
        "--index-target",
        choices=["attention", "question"],
        default="attention",
        help="what the indexer learns: where attention goes (DeepSeek's KL), or the tokens that are not filler",
    )
    parser.add_argument("--filler-max", type=int, default=0, help="most filler characters before a question")
    parser.add_argument("--eval-questions", type=int, default=1024, help="long-context: questions scored per eval")
    parser.add_argument("--init", type=Path, default=None, help="start from this weights file")
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace) -> tuple[ArithModel, dict[str, object]]:
    """The model to train: fresh from the flags' shapes, or ``--init``'s weights (with the flags' indexer and
    context length); returns it and facts for the weights' metadata."""
    context_len = args.context_len or (ModelConfig.context_len if not args.filler_max else 131072)
    index = {"index_heads": args.index_heads, "index_dim": args.index_dim if args.index_heads else 0}
    index["index_topk"] = args.index_topk if args.index_heads else 0
    if args.init is None:
        cfg = ModelConfig(
            d_model=args.d_model,
            d_ff=args.d_ff,
            n_layers=args.n_layers,
            n_heads=args.n_heads,
            d_latent=args.d_latent,
            d_rope=args.d_rope,
            context_len=context_len,
            **index,
        )
        return ArithModel(cfg), {}
    start, meta = load_model(args.init, "cpu")
    cfg = replace(start.cfg, context_len=context_len, **index)
    model = ArithModel(cfg)
    missing, unexpected = model.load_state_dict(start.state_dict(), strict=False)
    if unexpected or any(".indexer." not in key for key in missing):
        raise ValueError(f"{args.init} does not fit the model asked for: missing {missing}, unexpected {unexpected}")
    return model, {"init": f"{args.init.name} (exact {meta.get('exact_accuracy', '?')})"}


def main(argv: list[str] | None = None) -> int:
    """Train (or, with ``--steps 0``, initialise) and write the weights; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 0 or args.batch_size < 1 or args.time_limit <= 0:
        print("error: --steps must be >= 0, --batch-size >= 1 and --time-limit > 0", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        model, init_meta = build_model(args)
    except (OSError, ValueError) as exc:
        print(f"error: --init: {exc}", file=sys.stderr)
        return 2
    model = model.to(args.device)
    cfg = model.cfg
    n_params = sum(p.numel() for p in model.parameters())
    table = question_table()
    rng = random.Random(args.seed)
    if args.filler_max:
        # A fixed sample, drawn before training: every eval scores the same questions after the same fillers.
        eval_rng = random.Random(f"eval/{args.seed}")
        inputs, targets, mask = question_tensors(
            filler_items(eval_rng, table, args.eval_questions, args.filler_max), args.device
        )
    else:
        inputs, targets, mask = table_tensors(args.device)
    what = f"{inputs.shape[0]} questions" + (f" after 0..{args.filler_max} filler chars" if args.filler_max else "")
    print(f"model: {n_params} parameters, config {cfg.to_json()}; eval: {what}", flush=True)
    print(f"command: {' '.join(sys.argv)}", flush=True)
    meta: dict[str, object] = {"seed": args.seed, "parameters": n_params, "torch": torch.__version__, **init_meta}
    if args.filler_max:
        meta["filler_max"] = args.filler_max
    eval_chunk = 4096 if not args.filler_max else 64
    if args.steps == 0:
        # Not scored: the whole table takes a minute on two CPU cores, and an untrained model is exact on ~0%.
        save_model(model, args.out, {**meta, "steps": 0, "trained": "no"})
        print(f"untrained model written to {args.out}", flush=True)
        return 0

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.05)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    warmup = min(200, max(1, args.steps // 10))
    best_acc, best_state, best_step = -1.0, None, 0
    start = time.monotonic()
    step = 0
    while step < args.steps:
        elapsed = time.monotonic() - start
        if elapsed > args.time_limit:
            print(f"time limit reached at step {step}", flush=True)
            break
        progress = max(step / args.steps, elapsed / args.time_limit)
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        for group in opt.param_groups:
            group["lr"] = lr
        if args.filler_max:
            b_in, b_tgt, b_mask = question_tensors(
                filler_items(rng, table, args.batch_size, args.filler_max), args.device
            )
        else:
            batch = torch.randint(0, inputs.shape[0], (args.batch_size,), generator=gen).to(args.device)
            b_in, b_tgt, b_mask = inputs[batch], targets[batch], mask[batch]
        aux = Aux([], []) if cfg.has_indexer else None
        logits = model(b_in, aux=aux)
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b_tgt.flatten(), reduction="none")
        m = b_mask.flatten().float()
        loss = (losses * m).sum() / m.sum()
        if aux is not None:
            if args.index_target == "question":
                loss = loss + args.index_loss * question_index_loss(aux, b_in)
            else:
                loss = loss + args.index_loss * indexer_loss(aux, (b_in != PAD).float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == args.steps:
            loss_value = loss.item()
            acc = exact_accuracy(model, inputs, targets, mask, eval_chunk)
            print(f"step {step} loss {loss_value:.4f} lr {lr:.2e} exact {acc:.4%} t {elapsed:.0f}s", flush=True)
            if acc > best_acc:
                best_acc, best_step = acc, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if acc == 1.0:
                break
    if best_state is None:
        best_acc, best_step = exact_accuracy(model, inputs, targets, mask, eval_chunk), step
        best_state = model.state_dict()
    model.load_state_dict(best_state)
    seconds = time.monotonic() - start
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    save_model(
        model,
        args.out,
        {
            **meta,
            "steps": best_step,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "exact_accuracy": f"{best_acc:.6f}",
            "train_seconds": f"{seconds:.1f}",
            "device": device_name,
            "trained": "yes",
        },
    )
    print(f"wrote {args.out}: step {best_step}, exact accuracy {best_acc:.4%}, {seconds:.1f}s on {device_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
