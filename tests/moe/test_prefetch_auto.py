"""`--moe-prefetch auto` (moe/prefetch_choice.py, moe/step_variants.py): the chooser keeps the
faster of prefetch on and off from interleaved windows of simulated decode steps, keeps it
off on a tie, holds its verdict and re-checks it; the executor's graph variants pair the
live quota's with prefetch's, each forward runs as its variant names (bitwise the resident
executor's either way), the quota's controller sits out the steps the chooser measures, and
both settle on the best pair; the chooser's cost in scripts/prefetch_auto_model.py's replay;
the engine's tokens with it on CPU; the flag is never refused."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from edgemoe import LLM, SamplingParams
from edgemoe.config import EngineConfig
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.moe.prefetch_choice import PrefetchChooser, split_variant, with_prefetch
from edgemoe.moe.registry import make_executor
from edgemoe.testing.moe_material import KnownRouting, random_bank_store

L, E, K, H, I = 4, 8, 2, 16, 12
CPU = torch.device("cpu")
MS = 1e-3


def drive(chooser: PrefetchChooser, cost, steps: int, now: float = 0.0, batch: int | None = 1,  # noqa: ANN001
          log: list[bool] | None = None) -> float:
    """`steps` decode steps: each lasts `cost(on)` seconds for the choice it ran with (the
    chooser sees it as the period up to the next step's start). Returns the time after."""
    running = None
    for _ in range(steps):
        if running is not None:
            now += cost(running)
        chooser.step(now, batch)
        running = chooser.on
        if log is not None:
            log.append(running)
    return now + cost(running)


def noisy(on_ms: float, off_ms: float, jitter: float = 0.01, seed: int = 0):  # noqa: ANN201
    rng = random.Random(seed)
    return lambda on: (on_ms if on else off_ms) * MS * (1 + rng.uniform(-jitter, jitter))


@pytest.mark.parametrize(("on_ms", "off_ms", "verdict"), [(6.0, 8.4, True), (10.4, 8.4, False), (8.45, 8.4, False)])
def test_the_faster_choice_is_kept_and_a_tie_keeps_it_off(on_ms: float, off_ms: float, verdict: bool) -> None:
    chooser, ran, now, cost = PrefetchChooser(), [], 0.0, noisy(on_ms, off_ms)
    while chooser.measuring and len(ran) < 200:
        now = drive(chooser, cost, 1, now, log=ran)
    assert chooser.verdict is verdict and chooser.on is verdict and chooser.verdicts == 1
    assert True in ran[:-1] and False in ran[:-1]  # both measured before the verdict
    table = chooser.table()
    assert table["on"] == pytest.approx(on_ms, rel=0.02) and table["off"] == pytest.approx(off_ms, rel=0.02)
    rounds = chooser.max_rounds if on_ms == pytest.approx(off_ms, rel=0.02) else 1
    assert chooser.windows == 2 * rounds  # a tie measures up to max_rounds; a clear gap is told by one window each


def test_a_gap_within_a_clear_one_is_judged_over_interleaved_rounds() -> None:
    chooser, ran, now, cost = PrefetchChooser(), [], 0.0, noisy(8.0, 8.4, jitter=0.005)
    while chooser.measuring:
        now = drive(chooser, cost, 1, now, log=ran)
    switches = [i for i in range(1, len(ran)) if ran[i] != ran[i - 1]]
    assert chooser.verdict is True and chooser.windows == 2 * chooser.rounds
    assert len(switches) == 2 * chooser.rounds  # on, off, on, off, then on: the verdict


def test_a_verdict_is_held_then_checked_again_and_changes_with_the_costs() -> None:
    chooser = PrefetchChooser()
    now = drive(chooser, noisy(8.0, 8.4, jitter=0.005), 100)  # a gap within a clear one: a quarter hold
    assert chooser.verdict is True
    first_hold = chooser.hold // 4 * chooser.window
    now = drive(chooser, noisy(9.0, 8.4, seed=1), first_hold + 60, now)  # the guesses got worse meanwhile
    assert chooser.verdict is False and chooser.verdicts == 2 and chooser.snapshot()["prefetch_auto"] == "off"


@pytest.mark.parametrize(("on_ms", "windows"), [(6.0, 64), (8.0, 16)])
def test_a_clear_verdict_is_held_longest_at_once(on_ms: float, windows: int) -> None:
    chooser, now = PrefetchChooser(), 0.0
    while chooser.measuring:
        now = drive(chooser, noisy(on_ms, 8.4, jitter=0.005), 1, now)
    assert chooser._held == windows * chooser.window


def test_a_kept_verdict_is_held_twice_as_long_up_to_the_longest_hold() -> None:
    chooser, holds, now, cost = PrefetchChooser(hold=16), [], 0.0, noisy(8.0, 8.4, jitter=0.005)
    for _ in range(5):
        while chooser.measuring:
            now = drive(chooser, cost, 1, now)
        holds.append(chooser._held)
        now = drive(chooser, cost, chooser._held, now)
    assert [h // chooser.window for h in holds] == [4, 8, 16, 16, 16]


def test_a_recheck_waits_until_it_may_begin() -> None:
    chooser, now, cost = PrefetchChooser(hold=4), 0.0, noisy(8.0, 8.4, jitter=0.005)  # a hold of one window
    while chooser.measuring:
        now = drive(chooser, cost, 1, now)
    for _ in range(3 * chooser.window):  # the hold ran out a window ago; the quota is still searching
        chooser.step(now, 1, may_recheck=False)
        now += cost(chooser.on)
    assert not chooser.measuring
    assert chooser.step(now, 1) and chooser.measuring


def test_prompt_steps_and_new_batch_sizes_give_no_period() -> None:
    chooser = PrefetchChooser(window=2, settle=0)
    chooser.step(0.0, 1)
    chooser.step(1.0, None)  # a prompt chunk: its time is no decode step's
    chooser.step(1.5, 4)  # another batch size
    chooser.step(1.51, 1)
    assert chooser.windows == 0 and chooser._periods == []
    chooser.step(1.52, 1)
    assert chooser._periods == [pytest.approx(0.01)]


def test_the_chooser_refuses_settings_that_cannot_decide() -> None:
    for settings in ({"rounds": 0}, {"rounds": 5, "max_rounds": 4}, {"window": 0}, {"hold": 0}):
        with pytest.raises(ValueError, match="prefetch chooser"):
            PrefetchChooser(**settings)


def test_variants_pair_each_share_variant_with_prefetch() -> None:
    assert with_prefetch((None,)) == (None, "prefetch")
    assert with_prefetch(("plain", "share")) == ("plain", "plain+prefetch", "share", "share+prefetch")
    for variant in with_prefetch(("plain", "share")) + with_prefetch((None,)):
        base, on = split_variant(variant)
        assert (base, on) == ({"prefetch": None}.get(variant, variant.replace("+prefetch", "") if variant else None),
                              variant is not None and variant.endswith("prefetch"))


def offload_outputs(ex: DeviceOffloadExecutor, oracle: KnownRouting, variants: list, seed: int = 3) -> list:
    """Decode steps of one token, each run as the next of `variants`: the outputs."""
    g, outs = torch.Generator().manual_seed(seed), []
    for variant in variants:
        ex.use_graph_variant(variant)
        x = torch.randn(1, H, generator=g).to(torch.bfloat16)
        ids = {layer: torch.randperm(E, generator=g)[:K].view(1, K).int() for layer in range(L)}
        oracle.step = ids
        w = torch.softmax(torch.randn(1, K, generator=g), -1)
        outs.append([ex.forward(layer, x, ids[layer], w) for layer in range(L)])
    return outs


def test_each_forward_runs_as_its_variant_names_with_the_resident_outputs() -> None:
    store = random_bank_store(L, E, H, I, torch.bfloat16)
    ex = make_executor("offload", store, CPU, F.silu, L, 6 * K, expert_cache="device")
    oracle = KnownRouting()
    ex.enable_prefetch(oracle, K, auto=True)
    assert ex.graph_variants == (None, "prefetch") and ex.graph_variant == "prefetch"  # it measures on first
    got = offload_outputs(ex, oracle, [None] * 4)
    assert ex.prefetch.counts.sum() == 0  # type: ignore[union-attr]  # the variant without prefetch copies nothing ahead
    got += offload_outputs(ex, oracle, ["prefetch"] * 4, seed=4)
    assert ex.prefetch.counts[:, 0].sum() > 0  # type: ignore[union-attr]
    resident = make_executor("resident", store, CPU, F.silu, L, 0)
    want = offload_outputs(resident, KnownRouting(), [None] * 4) + offload_outputs(resident, KnownRouting(), [None] * 4,
                                                                                 seed=4)
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    ex.close()


def native_kernel() -> CpuExperts:
    kernel = CpuExperts(threads=1)
    if not kernel.native:
        kernel.close()
        pytest.skip("no compiled CPU expert kernel (no C compiler)")
    return kernel


def test_the_live_quota_sits_out_the_steps_the_chooser_measures() -> None:
    kernel = native_kernel()
    ex = DeviceOffloadExecutor(random_bank_store(L, E, H, I, torch.bfloat16), CPU, F.silu, L, 12, cpu_kernel=kernel,
                               live_quota="hybrid", top_k=K)
    ex.enable_prefetch(KnownRouting(), K, auto=True)
    assert ex.graph_variants == ("plain", "plain+prefetch", "share", "share+prefetch")
    assert ex.graph_variant == "share+prefetch"  # hybrid starts with a share; the chooser with prefetch
    chooser, ctl, now, seen = ex.prefetch_chooser, ex.controller, 0.0, []
    assert chooser is not None and ctl is not None
    while chooser.measuring:
        ex.before_step(now, 1)
        seen.append((ex.graph_variant, ctl.windows))
        now += 0.006 if chooser.on else 0.0084
    assert {w for _, w in seen} == {0}  # no quota window while the chooser measured
    assert {v for v, _ in seen} == {"share+prefetch", "share"} and chooser.verdict is True
    for _ in range(3 * ctl.window):
        ex.before_step(now, 1)
        now += 0.006
    assert ctl.windows > 0 and ex.graph_variant.endswith("+prefetch")  # type: ignore[union-attr]
    ex.close()
    kernel.close()


def test_engine_tokens_with_prefetch_auto(qwen3_ckpt, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A chooser that switches every other step: the tokens stay the resident engine's."""
    import edgemoe.moe.step_variants as step_variants

    monkeypatch.setattr(step_variants, "PrefetchChooser", partial(PrefetchChooser, window=1, settle=0, rounds=1,
                                                                  max_rounds=1, hold=1))
    prompts = [[9707, 11, 1879], list(range(3000, 3020))]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="resident", moe_prefetch="auto") as llm:
        want = [o.token_ids for o in llm.generate(prompts, greedy)]  # resident: nothing to prefetch, no refusal
        assert "prefetch_auto" not in llm.stats()["moe"]
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", expert_cache="device", moe_slots=8,
             moe_prefetch="auto") as llm:
        got = [o.token_ids for o in llm.generate(prompts, greedy)]
        moe = llm.stats()["moe"]
    assert got == want
    assert moe["prefetch"] == "router" and moe["prefetch_auto"] in ("measuring", "on", "off")
    assert moe["prefetch_auto_verdicts"] > 1 and moe["prefetched"] > 0


def test_auto_is_never_refused() -> None:
    for settings in ({"moe_backend": "resident"}, {"moe_backend": "cpu"}, {"expert_cache": "host"}):
        assert EngineConfig.from_kwargs(moe_prefetch="auto", **settings).moe.moe_prefetch == "auto"


@pytest.mark.parametrize(("on_ms", "off_ms"), [(6.02, 8.43), (11.8, 8.43), (8.75, 8.43)])
def test_the_chooser_costs_little_against_the_better_setting(on_ms: float, off_ms: float) -> None:
    """scripts/prefetch_auto_model.py's replay at the GPU machine's fp8 figures (the oracle,
    recall 0.6 and 0.8): over 512 simulated steps from a cold start auto keeps ≥ 0.96 of the
    better setting's rate, the issue's 5% with room for a real host's drift."""
    from script_module import load_script

    model = load_script("prefetch_auto_model")
    seconds, slow = model.replay(on_ms, off_ms, 512, 0.03, seed=0)
    assert 512 / seconds >= 0.96 * 1e3 / min(on_ms, off_ms) and slow <= 64


class _Share:
    rows = 64

    def apply_level(self, level: int) -> None:
        pass

    def expect_rings(self, expect: bool) -> None:
        pass


class _Prefetch:
    def covers(self, rows: int) -> bool:
        return rows <= 64


def test_the_chooser_and_the_live_quota_settle_on_the_best_pair() -> None:
    """`StepVariants._steer` over simulated steps whose time depends on both choices: with
    prefetch hiding copies the best share is smaller (8/16 of the misses, as bf16 hybrid
    measured, against 12/16 without) and every step faster. Both settle there."""
    from edgemoe.moe.quota_controller import QuotaController
    from edgemoe.moe.step_variants import StepVariants

    steer = StepVariants()
    steer.cpu_share, steer.prefetch = _Share(), _Prefetch()  # type: ignore[assignment]
    steer.controller = ctl = QuotaController(max_level=16, start=4, stride=2)
    ctl.predicted = 4  # no informed start here (it reads the device's miss counts)
    steer.prefetch_chooser = PrefetchChooser()
    steer._level = -1
    rng, now = random.Random(5), 0.0

    def cost(level: int, on: bool) -> float:
        return (0.0145 if on else 0.0171) + 0.0004 * abs(level - (8 if on else 12))

    for _ in range(3000):
        steer._steer(now, 1)
        now += cost(steer._level, steer._prefetching) * (1 + rng.uniform(-0.01, 0.01))
    assert steer.prefetch_chooser.verdict is True
    assert ctl.snapshot()["cpu_quota_settled"] == ctl.scale.value(8) and abs(ctl.level - 8) <= ctl.stride
