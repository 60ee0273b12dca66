"""Train the Hugging Face export of the arithmetic model (DeepSeek-V3 architecture), and score a checkpoint folder.

``python -m campaign.refserver.hf_train --out DIR [--device cuda] [--steps N] [--time-limit S] [--seed S] [--lr LR]``
trains ``DeepseekV3ForCausalLM`` (transformers' own model code) on the whole question table and writes a complete
checkpoint folder (``campaign.refserver.hf_export``); the loss covers only the answer characters and ``eos``, as in
``campaign.refserver.train``. Every ``--eval-every`` steps the whole table is scored teacher-forced (exact when the
argmax at every answer position is right); training stops at 100%, at ``--steps`` or at ``--time-limit``, and the
best state is written. The written folder is then scored as a user would load it.

``python -m campaign.refserver.hf_train --score DIR [--device cpu] [--sample N] [--min-accuracy A]`` loads a folder
with ``AutoModelForCausalLM``/``AutoTokenizer``, renders each question through its chat template, decodes greedily
with ``generate`` and counts exact answers (the whole table, or a seeded sample of N questions).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from campaign.refserver.hf_export import build_model, hf_config, save_weights, write_metadata
from campaign.refserver.questions import Question, question_table
from campaign.refserver.train import table_tensors


@dataclass
class Score:
    """How a checkpoint answered: questions asked, exact answers, and the first wrong ones."""

    asked: int
    exact: int
    seconds: float
    wrong: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        """Exact answers over questions asked."""
        return self.exact / self.asked if self.asked else 0.0

    def line(self) -> str:
        """One line for a log."""
        return f"exact {self.exact}/{self.asked} ({self.accuracy:.4%}) in {self.seconds:.1f}s"


def _autocast(device: str) -> Any:
    """bf16 autocast on CUDA (the checkpoint's dtype); nothing on CPU."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def teacher_forced_exact(model: Any, inputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of questions whose every answer position (and the eos after it) is the argmax."""
    was_training = model.training
    model.eval()
    exact = 0
    device = str(inputs.device)
    for lo in range(0, inputs.shape[0], 4096):
        with _autocast(device):
            pred = model(input_ids=inputs[lo : lo + 4096]).logits.argmax(-1)
        wrong = (pred != targets[lo : lo + 4096]) & mask[lo : lo + 4096]
        exact += int((~wrong.any(dim=1)).sum())
    model.train(was_training)
    return exact / inputs.shape[0]


@torch.no_grad()
def score(
    checkpoint: Path,
    device: str,
    *,
    sample: int | None = None,
    seed: int = 0,
    batch_size: int = 2048,
    dtype: str = "auto",
) -> Score:
    """Greedy answers of the checkpoint folder to the table (or a seeded sample), asked through its chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).to(device).eval()
    table: list[Question] = question_table()
    if sample is not None and sample < len(table):
        table = random.Random(seed).sample(table, sample)
    exact, wrong = 0, list[str]()
    for lo in range(0, len(table), batch_size):
        chunk = table[lo : lo + batch_size]
        prompts = [
            tok.apply_chat_template([{"role": "user", "content": q.text}], tokenize=False, add_generation_prompt=True)
            for q in chunk
        ]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        out = model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        replies = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for q, reply in zip(chunk, replies, strict=True):
            if reply.strip() == str(q.answer):
                exact += 1
            elif len(wrong) < 20:
                wrong.append(f"{q.text} -> {reply!r} (expected {q.answer})")
    return Score(asked=len(table), exact=exact, seconds=time.monotonic() - start, wrong=wrong)


def train(args: argparse.Namespace) -> int:
    """Train, write the checkpoint folder, score it; returns the exit code."""
    torch.manual_seed(args.seed)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    config = hf_config()
    model = build_model(config, args.seed).to(args.device).train()
    n_params = sum(p.numel() for p in model.parameters())
    inputs, targets, mask = table_tensors(args.device)
    print(f"model: DeepseekV3ForCausalLM, {n_params} parameters; table: {inputs.shape[0]} questions", flush=True)
    print(f"command: python -m campaign.refserver.hf_train {' '.join(sys.argv[1:])}", flush=True)
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
        with _autocast(args.device):
            logits = model(input_ids=inputs[batch]).logits
        losses = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), targets[batch].flatten(), reduction="none"
        )
        m = mask[batch].flatten().float()
        loss = (losses * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == args.steps:
            acc = teacher_forced_exact(model, inputs, targets, mask)
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} exact {acc:.4%} t {elapsed:.0f}s", flush=True)
            if acc > best_acc:
                best_acc, best_step = acc, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if acc == 1.0:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    seconds = time.monotonic() - start
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    import transformers

    meta = {
        "trained": "yes",
        "seed": args.seed,
        "steps": best_step,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "teacher_forced_exact": f"{best_acc:.6f}",
        "train_seconds": f"{seconds:.1f}",
        "device": device_name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    write_metadata(args.out, config)
    save_weights(model, args.out, {k: str(v) for k, v in meta.items()})
    print(f"wrote {args.out}: step {best_step}, teacher-forced exact {best_acc:.4%}, {seconds:.1f}s on {device_name}")
    result = score(args.out, args.device)
    print(f"score of {args.out} (from_pretrained, chat template, greedy generate on {device_name}): {result.line()}")
    for line in result.wrong:
        print(f"  wrong: {line}")
    (args.out / "score.json").write_text(json.dumps({**meta, "exact": result.exact, "asked": result.asked}) + "\n")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m campaign.refserver.hf_train", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, help="train and write the checkpoint folder here")
    what.add_argument("--score", type=Path, help="score this checkpoint folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=12000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=300.0, help="hard cap on training seconds")
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--sample", type=int, help="with --score: a seeded sample of this many questions")
    parser.add_argument("--dtype", default="auto", help="with --score: load in this dtype (default: the checkpoint's)")
    parser.add_argument("--min-accuracy", type=float, default=0.0, help="with --score: exit 1 below this")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train or score; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.score is not None:
        if not (args.score / "config.json").is_file():
            print(f"error: --score {args.score}: no config.json there (not a checkpoint folder)", file=sys.stderr)
            return 2
        result = score(args.score, args.device, sample=args.sample, seed=args.seed, dtype=args.dtype)
        print(f"{args.score} ({args.dtype}, {args.device}): {result.line()}")
        for line in result.wrong:
            print(f"  wrong: {line}")
        return 0 if result.accuracy >= args.min_accuracy else 1
    if args.steps < 1 or args.batch_size < 1 or args.time_limit <= 0:
        print("error: --steps and --batch-size must be >= 1 and --time-limit > 0", file=sys.stderr)
        return 2
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
