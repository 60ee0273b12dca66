"""The committed model over the whole question table, through the server's own batched greedy decode path."""

from __future__ import annotations

import pytest
import torch

from campaign.refserver.engine import Engine, EngineArgs
from campaign.refserver.kvpool import KVPool, pool_tokens
from campaign.refserver.questions import question_table
from campaign.refserver.tokenizer import EOS, decode_ids, encode_prompt


@pytest.fixture(scope="module")
def engine() -> Engine:
    # Big batches keep the whole table to about a minute on two CPU cores. 4096 running requests take 28% less CPU
    # than 1024 and give the same tokens (2026-12-05, the shared 2-core dev VM at load 12-16: the first 4096
    # questions 25.2 s against 34.8 s; every 24th question, 2084, 13.0 s against 18.0 s, outputs identical).
    return Engine(EngineArgs(device="cpu", disable_cuda_graph=True, max_running_requests=4096))


def test_whole_table_is_answered_exactly(engine: Engine) -> None:
    table = question_table()
    assert len(table) == 50_000
    outputs = engine.generate([encode_prompt(q.text) for q in table], 8)
    wrong = [(q.text, decode_ids(o)) for q, o in zip(table, outputs, strict=True) if decode_ids(o) != str(q.answer)]
    assert len(wrong) <= 0.005 * len(table), f"{len(wrong)} wrong, e.g. {wrong[:10]}"
    assert all(o[-1] == EOS for o in outputs)
    # Every request gave its slots back.
    assert engine.pool.free_slots == engine.pool.n_tokens


def test_17_times_23(engine: Engine) -> None:
    assert decode_ids(engine.generate([encode_prompt("What is 17×23?")], 8)[0]) == "391"


def test_pool_reserves_and_releases_slots() -> None:
    pool = KVPool(2, 10, 8, torch.float32, torch.device("cpu"))
    first = pool.reserve(6)
    assert first is not None and len(set(first.tolist())) == 6
    assert pool.reserve(5) is None  # only 4 left: the request would wait
    second = pool.reserve(4)
    assert second is not None and not set(first.tolist()) & set(second.tolist())
    pool.release(first)
    assert pool.free_slots == 6 and pool.scratch_slot == 10 and pool.rows.shape == (2, 11, 8)


def test_a_memory_fraction_leaving_no_room_is_refused() -> None:
    with pytest.raises(RuntimeError, match="Not enough memory"):
        pool_tokens(torch.device("cpu"), 1280, max_total_tokens=None, mem_fraction_static=1e-6)
    assert pool_tokens(torch.device("cpu"), 1280, max_total_tokens=100, mem_fraction_static=None) == 100


def test_requests_joining_and_leaving_a_small_engine_get_the_answers_they_get_alone(engine: Engine) -> None:
    # Two table rows for six requests of different lengths: rows are reused while the overlapped decode runs, and
    # requests are admitted between decode steps of others. Each answer must be what the request gets alone.
    small = Engine(EngineArgs(device="cpu", disable_cuda_graph=True, max_running_requests=2))
    texts = [f"What is {a}×{b}?" for a, b in [(17, 23), (9, 9), (45, 67), (12, 3), (88, 91), (5, 50)]]
    alone = [engine.generate([encode_prompt(t)], 8)[0] for t in texts]
    assert small.generate([encode_prompt(t) for t in texts], 8) == alone
    assert decode_ids(alone[0]) == "391"
    assert small.pool.free_slots == small.pool.n_tokens and small.idle


def test_an_aborted_request_stops_and_gives_its_slots_back() -> None:
    from campaign.refserver.request import Request

    small = Engine(EngineArgs(device="cpu", disable_cuda_graph=True, max_running_requests=2))
    got: list[int | None] = []
    request = Request(encode_prompt("What is 17×23?"), 30, ignore_eos=True, sink=lambda t, _r: got.append(t))
    small.submit(request)
    small.step()  # prefill and the first decode step launched
    small.step()
    small.abort(request)
    for _ in range(3):
        small.step()
    assert 2 <= len(got) <= 4 and len(request.output) == len(got)  # no token handed out after the abort settled
    assert small.idle and small.pool.free_slots == small.pool.n_tokens


def test_sampling_at_a_temperature_is_seeded_and_ends_like_greedy() -> None:
    from campaign.refserver.request import Request

    def sample() -> list[int]:
        small = Engine(EngineArgs(device="cpu", disable_cuda_graph=True, max_running_requests=4))
        requests = [Request(encode_prompt("What is 17×23?"), 12, temperature=t) for t in (0.0, 5.0, 5.0)]
        for r in requests:
            small.submit(r)
        while not small.idle:
            small.step()
        assert decode_ids(requests[0].output) == "391"  # the greedy one beside sampled ones stays exact
        return [tok for r in requests for tok in r.output]

    assert sample() == sample()
