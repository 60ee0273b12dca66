"""Train the arithmetic model on the whole question table and write its weights.

``python -m campaign.refserver.train --out PATH [--device cuda] [--steps N] [--seed S] [--time-limit SECONDS]``

Every step samples a batch from the 50,000-question table; the loss covers only the answer characters and ``eos``.
Every ``--eval-every`` steps the whole table is scored teacher-forced: a question counts as exact when the argmax
at every answer position is the right character, which is exactly when greedy decoding reproduces the answer.
Training stops at 100% exact, at ``--steps``, or at ``--time-limit`` (the learning rate anneals over whichever
comes first), and the best checkpoint is written. ``--steps 0`` writes the untrained model at once: a real model
that answers wrong.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from campaign.refserver.model import ArithModel, ModelConfig, save_model
from campaign.refserver.questions import question_table
from campaign.refserver.tokenizer import EOS, PAD, encode_prompt, encode_text


def table_tensors(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole table as (inputs [Q, T], targets [Q, T], loss mask [Q, T]) right-padded with ``PAD``."""
    seqs: list[list[int]] = []
    starts: list[int] = []
    for question in question_table():
        prompt = encode_prompt(question.text)
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


@torch.no_grad()
def exact_accuracy(model: ArithModel, inputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of questions whose every answer position is predicted right (teacher-forced argmax)."""
    model.eval()
    exact = 0
    for lo in range(0, inputs.shape[0], 4096):
        pred = model(inputs[lo : lo + 4096]).argmax(-1)
        wrong = (pred != targets[lo : lo + 4096]) & mask[lo : lo + 4096]
        exact += int((~wrong.any(dim=1)).sum())
    model.train()
    return exact / inputs.shape[0]


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
    return parser.parse_args(argv)


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
    cfg = ModelConfig(d_model=args.d_model, d_ff=args.d_ff, n_layers=args.n_layers)
    model = ArithModel(cfg).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    inputs, targets, mask = table_tensors(args.device)
    print(f"model: {n_params} parameters, config {cfg.to_json()}; table: {inputs.shape[0]} questions", flush=True)
    print(f"command: {' '.join(sys.argv)}", flush=True)
    meta: dict[str, object] = {"seed": args.seed, "parameters": n_params, "torch": torch.__version__}
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
        batch = torch.randint(0, inputs.shape[0], (args.batch_size,), generator=gen).to(args.device)
        logits = model(inputs[batch])
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[batch].flatten(), reduction="none")
        m = mask[batch].flatten().float()
        loss = (losses * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == args.steps:
            loss_value = loss.item()
            acc = exact_accuracy(model, inputs, targets, mask)
            print(f"step {step} loss {loss_value:.4f} lr {lr:.2e} exact {acc:.4%} t {elapsed:.0f}s", flush=True)
            if acc > best_acc:
                best_acc, best_step = acc, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if acc == 1.0:
                break
    if best_state is None:
        best_acc, best_step = exact_accuracy(model, inputs, targets, mask), step
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
