"""Smoke judges the answer, not the phrasing: real HTTP servers on loopback, and the reference server through the loop.

The phrasing server (``tests.fixtures.chat_server``) answers as instruct and reasoning models do; the reference
server runs with its documented fault injection (``--inject-fault``) for kernels that are wrong without (or only
sometimes) changing an answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from campaign.answer import parse_answer
from campaign.config import SmokeConfig
from campaign.diagnose import diagnose
from campaign.golden import Reference
from campaign.records import RunReport, SmokeCheck, SmokeResult
from campaign.smoke import burst_max, burst_sizes, burst_timeout, questions, run_smoke
from tests.fixtures.chat_server import STYLES, ChatServer
from tests.fixtures.refserver import free_port

REPO = Path(__file__).resolve().parents[1]
#: 8 seeded questions plus 17×23, then bursts of 2, 4 and 8.
SETTINGS = SmokeConfig(questions=8, seed=0, burst_max=8)
SEQUENTIAL = 9
TOTAL = SEQUENTIAL + 2 + 4 + 8


def smoke(server: ChatServer, settings: SmokeConfig = SETTINGS, **kwargs: Any) -> SmokeResult:
    return run_smoke(server.url, settings, **kwargs)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("391", 391),
        ("17 × 23 = 391", 391),
        ("To get 17 × 23: 17 × 20 = 340, plus 51, so 17 × 23 = 391.", 391),
        ("The answer is **391**.", 391),
        ("$17 \\times 23 = 391$", 391),
        ("\\(\\boxed{391}\\)", 391),
        ("\\boxed{1{,}728}", 1728),
        ("$1\\,728$", 1728),
        ("1,728", 1728),
        ("<think>\n17 × 23 = 390? no, 391.\n</think>\n\n**391**", 391),
        ("5 - 77 = −72", -72),
        ("391.0", 391),
        ("17.5", 17.5),
        ("<think>\nOkay, the user asks for 17 × 23", None),
        ("I cannot help with that.", None),
    ],
)
def test_the_final_answer_is_read_whatever_the_phrasing(text: str, value: int | float | None) -> None:
    assert parse_answer(text).value == value


def test_bursts_cover_every_bucket_up_to_the_variant_batch() -> None:
    assert burst_sizes(8) == [2, 4, 8]
    assert burst_sizes(48) == [2, 4, 8, 16, 32, 48]
    assert burst_sizes(1) == []
    default = SmokeConfig()
    assert burst_max(default, {"cuda_graph_max_bs": 16, "max_batch": 64}) == 16
    assert burst_max(default, {"max_batch": 8}) == 8
    assert burst_max(default, {}) == 32
    assert burst_max(SmokeConfig(burst_max=4), {"cuda_graph_max_bs": 16}) == 4
    # A burst of 32 on a server that answers one at a time in 2.5 s: 60 s plus the wait behind the other 31.
    sequential = [SmokeCheck(question="q", expected=1, phase="sequential", batch=1, latency_s=t) for t in (1.0, 2.5)]
    assert burst_timeout(60.0, 32, sequential) == 60.0 + 31 * 2.5
    assert burst_timeout(60.0, 1, sequential) == 60.0


@pytest.mark.parametrize(
    ("style", "reasoning_off"),
    [(s, True) for s in STYLES if s != "think"] + [("think", False), ("think", True), ("mixed", False)],
)
def test_right_answers_pass_in_every_phrasing(style: str, reasoning_off: bool) -> None:
    settings = SETTINGS.model_copy(update={"reasoning_off": reasoning_off})
    with ChatServer(style) as server:
        result = smoke(server, settings)
    assert result.ok, result.summary()
    assert [c.verdict for c in result.checks] == ["right"] * TOTAL
    assert result.passed == result.total == TOTAL
    assert server.max_in_flight >= 2, "the burst never overlapped"
    first = server.requests[0]
    assert first["messages"][0] == {"role": "system", "content": "Reply with only the final number."}
    assert first["temperature"] == 0 and first["max_tokens"] == 256 and first["logprobs"] is True
    assert ("chat_template_kwargs" in first) is reasoning_off
    if style == "reasoning":
        assert all(c.reasoning and "step by step" in c.reasoning for c in result.checks)
    if style == "think" and not reasoning_off:
        assert all(c.reply and c.reply.startswith("<think>") for c in result.checks)


def test_completions_api_with_its_prompt_template() -> None:
    settings = SETTINGS.model_copy(update={"api": "completions"})
    with ChatServer("restated") as server:
        result = smoke(server, settings)
    assert result.ok, result.summary()
    assert result.api == "completions" and result.passed == TOTAL
    assert server.requests[0]["prompt"] == "Reply with only the final number.\nWhat is 17×23?\nAnswer:"
    assert server.requests[0]["logprobs"] == 5
    assert result.checks[0].tokens == list("17 × 23 = 391")


def test_a_reply_cut_at_max_tokens_is_reported_as_cut_not_wrong() -> None:
    settings = SETTINGS.model_copy(update={"reasoning_off": False, "max_tokens": 24, "burst": False})
    with ChatServer("think") as server:
        result = smoke(server, settings)
    assert not result.ok
    assert {c.verdict for c in result.checks} == {"cut"}
    assert all(c.error == "cut at max_tokens (24) inside a think block before an answer" for c in result.checks)
    assert f"0/{SEQUENTIAL} answers right; {SEQUENTIAL} cut at max_tokens before an answer" == result.summary()
    with ChatServer("reasoning") as server:
        result = smoke(server, settings)
    assert {c.verdict for c in result.checks} == {"cut"}
    assert all(c.reply == "" and c.reasoning for c in result.checks)
    assert "inside a think block" in (result.checks[0].error or "")


def test_max_tokens_stays_within_the_served_context() -> None:
    with ChatServer("plain", max_model_len=40) as server:
        result = smoke(server)
    assert result.ok, result.summary()
    assert {r["max_tokens"] for r in server.requests} == {20}
    assert "max_tokens 256 capped at 20, half the served context 40" in result.notes


def test_a_server_that_refuses_the_reasoning_switch_or_logprobs_is_asked_without_them() -> None:
    with ChatServer("plain", refuse=("chat_template_kwargs",)) as server:
        result = smoke(server)
    assert result.ok, result.summary()
    assert result.reasoning_off is False
    assert "refused chat_template_kwargs" in result.notes[0]
    assert not any("chat_template_kwargs" in r for r in server.requests[1:])
    with ChatServer("plain") as server:
        reference = Reference(smoke(server), "run r1 attempt 0 (baseline)")
    with ChatServer("plain", refuse=("logprobs",)) as server:
        result = smoke(server, reference=reference)
    assert result.ok and result.reasoning_off is True and result.logprobs is None
    assert "refused logprobs" in result.notes[0] and "no log-probabilities to compare" in result.notes[-1]


def test_wrong_products_fail_with_the_evidence() -> None:
    with ChatServer("restated", wrong_when=lambda a, op, b: op == "×" and a * b > 2000) as server:
        result = smoke(server)
    assert not result.ok
    wrong = [c for c in result.checks if c.verdict == "wrong"]
    assert wrong and all("×" in c.question and c.expected > 2000 and c.got == c.expected + 1 for c in wrong)
    assert any(c.verdict == "right" for c in result.checks if "×" in c.question)
    assert all(c.verdict == "right" for c in result.checks if "+" in c.question)
    first = next(c for c in result.checks if c.verdict == "wrong")
    assert f"asked {first.question!r}, expected {first.expected}, got {first.reply!r}" in result.summary()


def test_wrong_only_in_batched_decode_fails_in_the_burst() -> None:
    with ChatServer("bold", wrong_batched=True) as server:
        alone = smoke(server, SETTINGS.model_copy(update={"burst": False}))
        result = smoke(server)
    assert alone.ok, "without the burst the batched bug goes unseen"
    assert not result.ok
    assert all(c.verdict == "right" for c in result.checks if c.phase == "sequential")
    wrong = [c for c in result.checks if c.verdict == "wrong"]
    assert wrong and all(c.phase == "burst" and c.batch >= 2 for c in wrong)
    assert "(burst of " in result.summary()


def test_a_burst_served_in_turn_waits_its_turn_and_a_stuck_one_times_out() -> None:
    """A burst request's timeout counts its wait behind the rest of the burst, not only its own reply."""
    settings = SETTINGS.model_copy(update={"questions": 2, "timeout_s": 1.0})
    with ChatServer("plain", serial_s=0.25) as server:
        result = smoke(server, settings)
    assert result.ok, result.summary()
    burst = [c.latency_s or 0.0 for c in result.checks if c.phase == "burst" and c.batch == 8]
    assert max(burst) > settings.timeout_s, "the last of the burst should have waited past timeout_s"
    with ChatServer("plain", batched_delay_s=5.0) as stuck:
        result = smoke(stuck, settings.model_copy(update={"burst_max": 2}))
    assert not result.ok
    assert all(c.verdict == "right" for c in result.checks if c.phase == "sequential")
    errors = [c.error or "" for c in result.checks if c.phase == "burst"]
    assert errors and all("ReadTimeout: no reply within" in e and "(burst of 2:" in e for e in errors), errors


def test_golden_mode_compares_greedy_tokens_with_the_known_good() -> None:
    """A model whose arithmetic is off for some questions passes golden mode when its outputs did not change."""
    golden = SETTINGS.model_copy(update={"mode": "golden"})

    def inexact(a: int, op: str, b: int) -> bool:
        return op == "×" and (a + b) % 3 == 0

    with ChatServer("mixed", wrong_when=inexact) as server:
        first = smoke(server, golden)
        assert first.ok and first.passed < first.total, first.summary()
        assert first.agreement is None and "no known-good" in first.notes[-1]
        reference = Reference(first, "run r1 attempt 0 (baseline)")
        again = smoke(server, golden, reference=reference)
    assert again.ok, again.summary()
    assert again.agreement is not None and again.agreement.value == 1.0
    assert again.agreement.compared == TOTAL and again.agreement.reference == "run r1 attempt 0 (baseline)"

    with ChatServer("mixed", wrong_when=lambda a, op, b: op == "+") as drifted:
        result = smoke(drifted, golden, reference=reference)
    assert not result.ok
    assert result.agreement is not None and not result.agreement.passed and result.agreement.value < 0.9
    assert "first differs at token" in result.agreement.detail
    assert "agreement" in result.summary() and "FAILED" in result.summary()


def test_logprobs_off_the_known_goods_fail_even_with_every_answer_right() -> None:
    with ChatServer("plain") as server:
        reference = Reference(smoke(server), "run r1 attempt 0 (baseline)")
    with ChatServer("plain") as same:
        fine = smoke(same, reference=reference)
    assert fine.ok and fine.logprobs is not None and fine.logprobs.value == 0.0
    with ChatServer("plain", logprob_scale=0.7) as moved:
        result = smoke(moved, reference=reference)
    assert result.passed == result.total == TOTAL
    assert not result.ok
    assert result.logprobs is not None and not result.logprobs.passed
    assert result.logprobs.value == pytest.approx(0.3)
    assert result.logprobs.detail == "'What is 17×23?' token 1 '3', alternative '2': known-good -12, this attempt -8.4"


def test_burst_outputs_are_compared_but_only_sequential_ones_are_kept() -> None:
    with ChatServer("plain") as server:
        result = smoke(server)
    kept = [c for c in result.checks if c.tokens is not None]
    assert kept and all(c.phase == "sequential" for c in kept)
    assert {c.question for c in result.checks} == {q for q, _ in questions(8, 0)}


def test_the_diagnosis_names_what_smoke_saw() -> None:
    """Wrong answers and outputs off the known-good's are decisive; a reply cut at max_tokens is named as such."""
    log = (REPO / "tests" / "data" / "variants" / "healthy--refserver-cpu.log").read_text()
    cut_settings = SETTINGS.model_copy(update={"reasoning_off": False, "max_tokens": 24, "burst": False})
    with ChatServer("think") as server:
        cut = diagnose(log, server="refserver", phase="smoke", smoke=smoke(server, cut_settings))
    assert cut.kind == "wrong_output" and cut.confidence == 0.5
    assert "cut at max_tokens before an answer" in cut.summary
    with ChatServer("plain") as server:
        reference = Reference(smoke(server), "run r1 attempt 0 (baseline)")
    with ChatServer("plain", logprob_scale=0.7) as server:
        moved = diagnose(log, server="refserver", phase="smoke", smoke=smoke(server, reference=reference))
    assert moved.kind == "wrong_output" and moved.confidence == 0.9
    assert f"{TOTAL}/{TOTAL} answers right; logprobs 0.3 (needs <= 0.1) FAILED" in moved.summary


# -- the reference server through the loop ---------------------------------------------------------------------------


def test_faulty_attention_backends_each_fail_their_check(tmp_path: Path) -> None:
    """×0.7 keeps every answer right and fails the logprob check; wrong-at-batch>1 fails the burst's answers."""
    doc = {
        "name": "faults",
        "host": {"kind": "local", "workdir": str(tmp_path / "box")},
        "recipe": "refserver",
        "vars": {"python": sys.executable},
        "baseline": {"knobs": {"device": "cpu", "attention": "torch", "cuda_graph": False, "port": free_port()}},
        "variants": [
            {"name": "scaled", "args": ["--inject-fault", "attention-x0.7"]},
            {"name": "batched", "args": ["--inject-fault", "attention-batched"]},
        ],
        "smoke": {"questions": 4, "seed": 3, "burst_max": 8},
        "timeouts": {"ready_s": 90, "stop_grace_s": 5},
        "at_end": "stop",
    }
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    runs = tmp_path / "runs"
    res = subprocess.run(
        [sys.executable, "-m", "campaign.cli", "--runs-dir", str(runs), "run", str(path), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 1, res.stderr
    report = RunReport.model_validate_json((runs / json.loads(res.stdout)["run_id"] / "report.json").read_text())
    att = {a.variant: a for a in report.attempts if a.role == "variant"}

    base = att["baseline"]
    assert base.outcome == "passed" and base.smoke is not None and base.smoke.ok
    assert base.smoke.total == 5 + 2 + 4 + 8 and base.smoke.checks[0].tokens == ["3", "9", "1"]

    scaled = att["scaled"]
    assert scaled.outcome == "failed" and scaled.failed_phase == "smoke" and scaled.smoke is not None
    assert scaled.smoke.passed == scaled.smoke.total, "the ×0.7 backend still answers every question right"
    lp = scaled.smoke.logprobs
    assert lp is not None and not lp.passed and lp.value > 0.3
    assert lp.reference == f"run {report.run_id} attempt 0 (baseline)"
    assert scaled.diagnosis is not None and scaled.diagnosis.kind == "wrong_output"
    assert "logprobs" in scaled.diagnosis.summary and "FAILED" in scaled.diagnosis.summary

    batched = att["batched"]
    assert batched.outcome == "failed" and batched.smoke is not None
    assert all(c.verdict == "right" for c in batched.smoke.checks if c.phase == "sequential")
    assert any(c.verdict == "wrong" and c.batch >= 2 for c in batched.smoke.checks)
    assert batched.diagnosis is not None and "(burst of " in batched.diagnosis.summary
    for failed in (scaled, batched):
        assert failed.restore is not None and failed.restore.outcome == "restored"
    restores = [a for a in report.attempts if a.role == "restore"]
    assert restores and all(r.smoke is not None and r.smoke.ok and r.smoke.logprobs is not None for r in restores)
