"""The prefix cache under an agent-shaped workload is invisible: every request's greedy
tokens and logprobs equal those of the same engine with the cache off (each request
computed alone, from scratch), and afterwards every KV page and snapshot row came back.

The workload (a condensed form of a randomized campaign over the tiny presets, page sizes
1/2/16, small KV, --host-cache, overlap on and off): multi-turn sessions (the next prompt
extends prompt + output, or re-renders the last answer's tail), sessions sharing a system
prompt in one batch, two branches of one prefix, regenerating an earlier turn (a strict
prefix ending mid-page and at a page boundary), an edit in the middle of a long prompt, a
repeated prompt (full hit), a 1-token prompt, and aborts mid-prefill of a request whose
pages are shared; KV small enough that pages are evicted (to the host tier) and requests
preempted while others run.
"""

from __future__ import annotations

import random

import pytest
import torch
from tolerances import log_softmax_atol, network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.llm import CompletionOutput

MODEL = "random:tiny-qwen3.5-moe"  # GDN hybrid: matches resume from state snapshots
N = 4  # tokens per request


def params(n: int = N) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2)


def run_batch(llm: LLM, prompts: list[list[int]], abort_at: dict[int, int] | None = None) -> list[CompletionOutput | None]:
    """Submit together; `abort_at[i] = k` aborts request i before step k (None: aborted)."""
    engine, abort_at = llm.engine, abort_at or {}
    assert engine is not None
    ids = [engine.add_request(p, params()) for p in prompts]
    outs: dict[str, CompletionOutput | None] = {i: CompletionOutput(prompt_token_ids=p) for i, p in zip(ids, prompts)}
    step = 0
    while engine.has_work():
        for i, k in abort_at.items():
            if k == step and engine.abort(ids[i]) is not None:
                outs[ids[i]] = None
        for out in engine.step():
            got = outs.get(out.request_id)
            if got is not None:
                got.add(out)
        step += 1
    return [outs[i] for i in ids]


class Reference:
    """The same settings with the prefix cache off, each prompt alone (memoised)."""

    def __init__(self, settings: dict) -> None:
        self.llm = LLM(MODEL, dtype="float32", cache_type="none",
                       **{k: v for k, v in settings.items() if k != "host_cache"})
        self.memo: dict[tuple[int, ...], tuple[CompletionOutput, torch.Tensor]] = {}

    def get(self, prompt: list[int]) -> tuple[CompletionOutput, torch.Tensor]:
        if tuple(prompt) not in self.memo:
            out = self.llm.generate([prompt], params())[0]
            logits = self.llm.prompt_logits(prompt + out.token_ids[:-1])[len(prompt) - 1 :]
            self.memo[tuple(prompt)] = (out, logits)
        return self.memo[tuple(prompt)]

    def check(self, prompt: list[int], got: CompletionOutput) -> None:
        want, logits = self.get(prompt)
        assert got.token_ids == want.token_ids, (len(prompt), got.num_cached_tokens)
        for i, (w, g) in enumerate(zip(want.logprobs or [], got.logprobs or [], strict=True)):
            row = logits[i]
            # other chunking / a resumed GDN state: logits within a network's rounding (hidden
            # 64 and the context are the longest reductions), a logprob within twice that
            # plus log_softmax's own rounding
            tol = 2 * network_atol(torch.float32, max(64, len(prompt) + i), row.abs().max().item())
            tol += log_softmax_atol(torch.float32, row.numel(), abs(w.logprob))
            assert g.logprob == pytest.approx(w.logprob, abs=tol), (len(prompt), i, got.num_cached_tokens)


def assert_everything_came_back(llm: LLM) -> None:
    engine = llm.engine
    assert engine is not None
    pool, cache, states = engine.runtime.pool, engine.prefix_cache, engine.runtime.states
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert pool.num_free + cache.total_pages == pool.num_pages
    assert cache.evictable_pages == cache.total_pages  # no lock left behind
    assert engine.scheduler.page_table.num_free == engine.scheduler.page_table.max_rows
    assert states.num_free_snapshots + cache.num_snapshots == states.snapshot_rows
    cache.reset()
    assert pool.num_free == pool.num_pages and states.num_free_snapshots == states.snapshot_rows


def workload(llm: LLM, ref: Reference, ps: int, rng: random.Random) -> int:
    """One pass of every workload shape; returns the prompt tokens served from the cache."""
    def toks(n: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(n)]

    def go(prompts: list[list[int]], abort_at: dict[int, int] | None = None) -> list[list[int]]:
        outs = run_batch(llm, prompts, abort_at)
        for p, o in zip(prompts, outs, strict=True):
            if o is not None:
                ref.check(p, o)
                cached[0] += o.num_cached_tokens
        return [o.token_ids if o is not None else [] for o in outs]

    cached = [0]
    system = toks(2 * ps + 3)
    t1 = system + toks(5)
    (a1,) = go([t1])
    t2 = t1 + a1 + toks(3)  # the next turn
    (a2,) = go([t2])
    go([t1 + a1[:-2] + toks(2) + toks(3)])  # the last answer re-rendered differently
    go([system + toks(rng.randint(1, 6)) for _ in range(3)])  # sessions sharing a system prompt
    go([t2 + a2 + toks(2), t2 + a2 + toks(3)])  # two branches of one conversation
    go([t2[: len(t2) // ps * ps], t2[: len(t2) // ps * ps - 1 or 1]])  # regenerate: at and before a boundary
    mid = len(t2) // 2
    go([t2[:mid] + toks(1) + t2[mid + 1 :]])  # an edit in the middle
    go([t2, [rng.randrange(100, 5000)]])  # a full hit, a 1-token prompt
    long = system + toks(3 * ps + 5)
    go([long, long + toks(2), t1], abort_at={0: 1})  # abort mid-prefill while its pages are shared
    go([long + toks(1), t2 + a2])
    return cached[0]


@pytest.mark.parametrize(
    "settings",
    [
        dict(page_size=1, kv_tokens=48, max_prefill_tokens=3, host_cache="256KiB", overlap=True),
        dict(page_size=2, kv_tokens=48, max_prefill_tokens=5, state_slots=12),
        dict(page_size=16, kv_tokens=128, max_prefill_tokens=17, host_cache="1MiB"),
    ],
    ids=["page1-host-overlap", "page2-few-snapshots", "page16-host"],
)
def test_agent_workload_matches_the_cache_off_engine(settings: dict, one_thread: None) -> None:
    ref = Reference(settings)
    with LLM(MODEL, dtype="float32", **settings) as llm:
        cached = workload(llm, ref, settings["page_size"], random.Random(settings["page_size"]))
        assert cached > 0, "the workload never hit the cache: a weak test"
        assert_everything_came_back(llm)
    ref.llm.close()


@pytest.fixture
def one_thread():  # noqa: ANN201
    """Tiny matrices: torch's thread pool costs more than it saves (30x on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
