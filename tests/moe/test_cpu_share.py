"""The device cache's CPU share (moe/cpu_share.py) on CPU tensors, where the host function
is called directly on the same mailbox: each layer's output is bitwise what its pieces
give computed apart (the resident kernel's cells for the device's pairs, the host path's
CPU cells for the last `quota` misses, the fixed-order k-sum); the cache state is the
state of a cache that never saw those experts; quota 0 is offload bitwise; the counters;
the settings' rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemoe.config import EngineConfig, MoEConfig
from edgemoe.kernels.cpu_kernel import CpuExperts
from edgemoe.moe.cache_choice import resolve_expert_cache
from edgemoe.moe.device_offload import DeviceOffloadExecutor
from edgemoe.kernels.share_state import FRACTION_ONE
from edgemoe.moe.quota_levels import COUNT, FRACTION, QUARTERS, LevelScale, quota_rows
from edgemoe.moe.registry import make_executor
from edgemoe.moe.store import BankStore

from cpu_share_support import (CPU, E, H, I, K, L, Heat, bf16_store, cpu_experts_of, expected, routings, same_state,
                               store_of)



@pytest.mark.parametrize("kind,slots,mover,fraction", [
    ("bf16", 5, "gather", FRACTION_ONE), ("bf16", K, "copy", FRACTION_ONE), ("int8", 4, "gather", FRACTION_ONE),
    ("int4", 4, "gather", FRACTION_ONE), ("mxfp4", 4, "gather", FRACTION_ONE),
    ("bf16", 5, "gather", 10), ("int8", 4, "gather", 6),  # a share of each layer's own misses
])
def test_cpu_pairs_and_the_cache_as_if_computed_apart(kernel: CpuExperts, kind: str, slots: int, mover: str,
                                                      fraction: int) -> None:
    store = store_of(kind)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    quotas = [1, 2, 0] if fraction == FRACTION_ONE else [E, 1, 0]  # per layer; layer 2 runs as plain offload
    share = DeviceOffloadExecutor(store, CPU, F.silu, L, slots, mover, cpu_experts_per_layer=1, cpu_kernel=kernel)
    share.cpu_share.quota.copy_(torch.tensor(quotas))
    share.cpu_share.fraction.fill_(fraction)
    share.cpu_share.rows = 4  # steps of 7 and 16 tokens run every miss on the device
    ref = DeviceOffloadExecutor(store, CPU, F.silu, L, slots, mover)  # sees the routing without the CPU's experts
    num_cpu, heat = 0, Heat()
    for x, ids, w in routings(seed=slots, dtype=dtype, steps=20):
        for layer in range(L):
            shared = x.shape[0] <= 4  # steps the share takes (heat counts them alone)
            quota = quotas[layer] if shared else 0
            on_cpu = cpu_experts_of(ref.cache.slot_map[layer], ids, quota, heat.heat[layer], fraction)
            if shared:
                heat.update(layer, ids)
            num_cpu += len(on_cpu)
            got = share.forward(layer, x, ids, w)
            ref.forward(layer, x, torch.where(torch.isin(ids, torch.tensor(on_cpu, dtype=ids.dtype)), -1, ids), w)
            assert torch.equal(got, expected(store, layer, x, ids, w, on_cpu, kernel)), (layer, on_cpu)
            assert same_state(share, ref)
    assert num_cpu > 0
    got, want = share.stats.snapshot(), ref.stats.snapshot()
    assert got["experts_cpu"] == num_cpu and got["misses"] == want["misses"] + num_cpu
    assert got["hits"] == want["hits"] and got["bytes_copied"] == want["bytes_copied"]
    # The host function timed its calls that had pairs (a call per layer step with CPU experts).
    assert 0 < got["cpu_calls"] <= num_cpu and got["cpu_seconds"] > 0 and got["cpu_us_per_call"] > 0
    assert torch.equal(share.cpu_share.heat, torch.tensor(heat.heat))


@pytest.mark.parametrize("fraction,quota,sixteenths", [(0.4, None, 6), (0.75, 1, 12), (1 / 32, None, 1), (0.0, None, 0)])
def test_a_fixed_fraction_of_each_layers_misses(kernel: CpuExperts, fraction: float, quota: int | None,
                                                sixteenths: int) -> None:
    """`--moe-hybrid-fraction` on the device cache: the decode pick at that share of each
    layer's misses (sixteenths, half up), within `--cpu-experts-per-layer` if given, and no
    live controller; the same cells and CPU experts as the reference pick."""
    store = bf16_store()
    share = make_executor("hybrid", store, CPU, F.silu, L, 4, hybrid_fraction=fraction, expert_cache="device",
                          cpu_experts_per_layer=quota)
    assert isinstance(share, DeviceOffloadExecutor) and share.controller is None
    assert int(share.cpu_share.fraction) == sixteenths
    assert share.cpu_share.quota.tolist() == [E if quota is None else quota] * L
    info = share.stats.snapshot()
    assert info["cpu_fraction_of_misses"] == sixteenths / 16
    assert (info.get("cpu_quota_unit") == FRACTION.unit) == (quota is None)
    heat, num_cpu = Heat(), 0
    ref = DeviceOffloadExecutor(store, CPU, F.silu, L, 4)
    for x, ids, w in routings(seed=4, dtype=torch.bfloat16, steps=5):
        if x.shape[0] > share.cpu_share.rows:
            continue
        for layer in range(L):
            on_cpu = cpu_experts_of(ref.cache.slot_map[layer], ids, E if quota is None else quota, heat.heat[layer],
                                    sixteenths)
            heat.update(layer, ids)
            num_cpu += len(on_cpu)
            got = share.forward(layer, x, ids, w)
            ref.forward(layer, x, torch.where(torch.isin(ids, torch.tensor(on_cpu, dtype=ids.dtype)), -1, ids), w)
            assert torch.equal(got, expected(store, layer, x, ids, w, on_cpu, share.cpu_share.kernel)), (layer, on_cpu)
    assert share.stats.snapshot()["experts_cpu"] == num_cpu
    assert num_cpu > 0 if sixteenths >= 6 else num_cpu == 0  # 1/16 takes one of 8 misses, never seen here
    share.close()


def test_quota_zero_is_offload_bitwise(kernel: CpuExperts) -> None:
    store = bf16_store()
    share = make_executor("hybrid", store, CPU, F.silu, L, 4, expert_cache="device", cpu_experts_per_layer=0)
    plain = make_executor("offload", store, CPU, F.silu, L, 4, expert_cache="device")
    assert isinstance(share, DeviceOffloadExecutor) and share.cpu_share is not None
    for x, ids, w in routings(seed=1, dtype=torch.bfloat16, steps=5):
        for layer in range(L):
            assert torch.equal(share.forward(layer, x, ids, w), plain.forward(layer, x, ids, w))
            assert same_state(share, plain)
    assert share.stats.snapshot()["experts_cpu"] == 0
    share.cpu_share.quota.fill_(E)  # the host raises the quota between steps: every miss on the CPU
    x, ids, w = next(routings(seed=2, dtype=torch.bfloat16))
    before = share.cache.slot_map.clone()
    share.forward(0, x, ids, w)
    assert torch.equal(share.cache.slot_map, before)  # nothing was inserted


def test_padding_rows_give_the_cpu_nothing(kernel: CpuExperts) -> None:
    store = bf16_store()
    share = DeviceOffloadExecutor(store, CPU, F.silu, L, 4, cpu_experts_per_layer=E, cpu_kernel=kernel)
    x, ids, w = next(routings(seed=3, dtype=torch.bfloat16))
    pad = torch.tensor([[E - 1, E - 2]], dtype=torch.int32)  # experts the real row doesn't route
    ids = ids[:1] if ids[0].max() < E - 2 else torch.tensor([[0, 1]], dtype=torch.int32)
    out = share.forward(0, torch.cat([x[:1], x[:1]]), torch.cat([ids, pad]), torch.cat([w[:1], w[:1]]), num_padding=1)
    assert (out[1] == 0).all()
    assert torch.equal(out[:1], expected(store, 0, x[:1], ids, w[:1], sorted(set(ids[0].tolist())), kernel))
    share.stats.resolve()
    assert share.stats.cpu_experts[0] == len(set(ids[0].tolist()))


def test_settings() -> None:
    assert resolve_expert_cache("auto", "cuda", "hybrid", "lru", cpu_experts_per_layer=2) == "device"
    assert resolve_expert_cache("auto", "cuda", "hybrid", "lru") == "device"  # the live quota
    assert resolve_expert_cache("auto", "cpu", "hybrid", "lru") == "host"
    store = bf16_store()
    # A fixed fraction runs on either cache (the device cache's since 2026-12-04).
    EngineConfig(moe=MoEConfig(moe_backend="hybrid", expert_cache="device", moe_hybrid_fraction=0.5)).validate()
    with pytest.raises(ValueError, match="moe-hybrid-fraction"):
        EngineConfig(moe=MoEConfig(moe_backend="hybrid", expert_cache="device", moe_hybrid_fraction=1.5)).validate()
    with pytest.raises(ValueError, match="not 'cpu'"):
        make_executor("cpu", store, CPU, F.silu, L, 4, expert_cache="device", cpu_experts_per_layer=1)
    with pytest.raises(ValueError, match="C expert kernel"):  # fp32 experts: no native path
        make_executor("hybrid", BankStore.allocate([0], E, H, I, torch.float32), CPU, F.silu, 1, 4,
                      expert_cache="device", cpu_experts_per_layer=1)
    for moe in (MoEConfig(moe_backend="offload", cpu_experts_per_layer=1),
                MoEConfig(moe_backend="hybrid", expert_cache="host", cpu_experts_per_layer=1),
                MoEConfig(moe_backend="hybrid", expert_cache="device", cpu_experts_per_layer=-1)):
        with pytest.raises(ValueError, match="cpu-experts-per-layer"):
            EngineConfig(moe=moe).validate()
    EngineConfig(moe=MoEConfig(moe_backend="hybrid", cpu_experts_per_layer=2)).validate()  # auto: the device cache


def levels_in_place(live: DeviceOffloadExecutor, scale: LevelScale, level: int) -> bool:
    """The level's quota rows and fraction in the share's tensors."""
    return (live.cpu_share.quota.tolist() == scale.rows(level, L, E)
            and int(live.cpu_share.fraction) == scale.fraction(level))


@pytest.mark.parametrize("scale,best", [(COUNT, 6), (FRACTION, 10)])  # 1.5 experts a layer; 10/16 of the misses
def test_a_live_quota_is_offload_bitwise_at_level_zero_and_follows_its_controller(
        kernel: CpuExperts, monkeypatch: pytest.MonkeyPatch, scale: LevelScale, best: int) -> None:
    monkeypatch.setenv("EDGEMOE_SHARE_SPLIT", scale.name)
    store = bf16_store()
    live = make_executor("hybrid", store, CPU, F.silu, L, 4, top_k=K, expert_cache="device")
    plain = make_executor("offload", store, CPU, F.silu, L, 4, expert_cache="device")
    assert isinstance(live, DeviceOffloadExecutor) and live.controller is not None
    assert live.graph_variants == ("plain", "share") and live.graph_variant == "share"  # hybrid starts with a share
    assert live.controller.scale is scale and levels_in_place(live, scale, scale.hybrid_start())
    assert scale.hybrid_start() == (QUARTERS if scale is COUNT else 8)  # one expert a layer; half of the misses
    assert quota_rows(QUARTERS, L) == [1] * L
    live._apply_level(0)  # offload: the runner replays the graphs without the share
    assert live.graph_variant == "plain"
    for x, ids, w in routings(seed=4, dtype=torch.bfloat16, steps=5):
        for layer in range(L):
            assert torch.equal(live.forward(layer, x, ids, w), plain.forward(layer, x, ids, w))
            assert same_state(live, plain)
    assert live.stats.snapshot()["experts_cpu"] == 0
    # Driven by step times: every level it picks lands in the quota tensor and the variant.
    ctl, now, quiet_steps = live.controller, 0.0, 0
    for step in range(200):
        live.before_step(now, None if step % 25 == 0 else 1)  # a prompt step now and then: no period
        assert levels_in_place(live, scale, ctl.level)
        assert live.graph_variant == ("share" if ctl.level else "plain")
        # the bell polls slowly only for decode steps that run without the share
        assert live.cpu_share.quiet == (step % 25 != 0 and ctl.level == 0)
        quiet_steps += live.cpu_share.quiet
        now += 0.01 * (1 + abs(ctl.level - best))
    assert ctl.snapshot()["cpu_quota_settled"] == scale.value(best)
    assert 0 < quiet_steps < 200 - 8  # the confirmation's offload windows were quiet
    assert ctl.snapshot()["cpu_quota_unit"] == scale.unit
    x, ids, w = next(routings(seed=5, dtype=torch.bfloat16))
    live._apply_level(ctl.max_level)  # every miss on the CPU
    calls, ns = live.cpu_share.busy_totals()
    live.forward(0, x[:2], ids[:2], w[:2])
    assert live.stats.snapshot()["experts_cpu"] > 0 and "cpu_quota_per_layer" in live.stats.snapshot()
    after = live.cpu_share.busy_totals()  # the step anatomy's reader: the C calls' own counters
    assert after[0] == calls + 1 and after[1] > ns


def test_auto_gets_a_live_share_on_a_gpu_only() -> None:
    auto = make_executor("auto", bf16_store(), CPU, F.silu, L, 4, top_k=K, expert_cache="device")
    assert isinstance(auto, DeviceOffloadExecutor) and auto.cpu_share is None and auto.controller is None
    assert auto.graph_variants == (None,)


def test_hybrid_without_a_readable_format_falls_back_to_offload(caplog: pytest.LogCaptureFixture) -> None:
    fp32 = BankStore.allocate([0], E, H, I, torch.float32)  # the C kernel reads bf16, int8, fp8, int4
    ex = make_executor("hybrid", fp32, CPU, F.silu, 1, 4, top_k=K, expert_cache="device")
    assert ex.cpu_share is None and ex.controller is None and "no CPU share" in caplog.text


@pytest.mark.parametrize("kind,slots", [("bf16", 5), ("int8", 4)])
def test_prompt_chunks_give_the_cpu_their_sparse_misses(kernel: CpuExperts, kind: str, slots: int) -> None:
    """`prompt_cpu`: chunks over the decode rows take the prompt rule (the fewest-token
    misses while the CPU's predicted time fits the device's for the rest): each layer's
    output bitwise its pieces, the cache a cache that never saw the CPU's experts; decode
    steps keep the quota's rule (0 here: nothing)."""
    from edgemoe.kernels.share_split import balanced_misses_ref
    from edgemoe.kernels.share_state import ShareState

    store = store_of(kind)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    share = DeviceOffloadExecutor(store, CPU, F.silu, L, slots, max_tokens=32, cpu_experts_per_layer=0,
                                  cpu_kernel=kernel, prompt_cpu=True)
    cs = share.cpu_share
    assert cs.prompt_rows == 0  # max_tokens 32 is within the decode rows: no prompt chunk to cover
    cs.rows, cs.prompt_rows = 2, 32  # here steps of 3 to 32 tokens are prompt chunks
    cs.rates.copy_(torch.tensor([100, 40, 400, 30]))  # a split that depends on each expert's tokens
    ref = DeviceOffloadExecutor(store, CPU, F.silu, L, slots)
    num_cpu = 0
    for x, ids, w in routings(seed=slots + 7, dtype=dtype, steps=15):
        for layer in range(L):
            on_cpu: list[int] = []
            if x.shape[0] > cs.rows:
                probe = ShareState(ref.cache.slot_map[layer].clone(), torch.zeros(E, dtype=torch.int64),
                                   torch.tensor(0), torch.tensor(16), torch.tensor(0), torch.zeros((), dtype=torch.int64),
                                   torch.zeros(1, dtype=torch.int64), torch.zeros(E, dtype=torch.int32), cs.rates)
                cap = cs.mailboxes.buffers.cap if cs.mailboxes is not None else None
                on_cpu = balanced_misses_ref(ids, probe, (cap or 4097) - 1).nonzero().flatten().tolist()
            num_cpu += len(on_cpu)
            got = share.forward(layer, x, ids, w)
            ref.forward(layer, x, torch.where(torch.isin(ids, torch.tensor(on_cpu, dtype=ids.dtype)), -1, ids), w)
            assert torch.equal(got, expected(store, layer, x, ids, w, on_cpu, kernel)), (layer, on_cpu)
            assert same_state(share, ref)
    assert num_cpu > 0 and share.stats.snapshot()["experts_cpu"] == num_cpu
    wide = DeviceOffloadExecutor(store, CPU, F.silu, L, slots, max_tokens=256, cpu_experts_per_layer=0,
                                 cpu_kernel=kernel, prompt_cpu=True)
    assert wide.cpu_share.prompt_rows == 256 and wide.stats.snapshot()["prompt_cpu"] is True


def test_prompt_cpu_settings() -> None:
    with pytest.raises(ValueError, match="prompt-cpu"):
        EngineConfig(moe=MoEConfig(moe_backend="offload", prompt_cpu=True)).validate()
    with pytest.raises(ValueError, match="prompt-cpu"):
        EngineConfig(moe=MoEConfig(moe_backend="hybrid", expert_cache="host", prompt_cpu=True)).validate()
    EngineConfig(moe=MoEConfig(moe_backend="auto", prompt_cpu=True)).validate()
    for backend in ("offload", "hybrid", "cpu"):  # unset: on only where the share runs, refused nowhere
        EngineConfig(moe=MoEConfig(moe_backend=backend, expert_cache="host")).validate()


def test_prompt_cpu_unset_is_on_where_the_share_runs(kernel: CpuExperts, caplog) -> None:  # noqa: ANN001
    """The default (None) gives a share its prompt rule, quietly; False takes it away; an
    executor without a share (offload) says nothing about a rule it didn't ask for."""
    store = store_of("bf16")
    made = {p: DeviceOffloadExecutor(store, CPU, F.silu, L, 5, max_tokens=256, cpu_experts_per_layer=0,
                                     cpu_kernel=kernel, prompt_cpu=p) for p in (None, False)}
    assert made[None].cpu_share.prompt_rows == 256 and made[None].stats.snapshot()["prompt_cpu"] is True
    assert made[False].cpu_share.prompt_rows == 0 and made[False].stats.snapshot()["prompt_cpu"] is False
    with caplog.at_level("WARNING"):
        quiet = DeviceOffloadExecutor(store, CPU, F.silu, L, 5, max_tokens=256, prompt_cpu=None)
        assert quiet.cpu_share is None and "--prompt-cpu" not in caplog.text
        DeviceOffloadExecutor(store, CPU, F.silu, L, 5, max_tokens=256, prompt_cpu=True)
    assert "--prompt-cpu: no CPU share here" in caplog.text


def test_the_cpu_rates_fit_recovers_a_cost_law() -> None:
    """`fit_cpu_rates` on sums of calls t = c + a·jobs + b·pairs: prompt-like calls (jobs and
    pairs vary apart) recover a and b; decode-like calls (a pair an expert) keep the total
    per expert and lean on the prior for the split; nothing yet: the prior."""
    from edgemoe.moe.cpu_share import fit_cpu_rates

    def sums(calls: list[tuple[int, int]], c: float, a: float, b: float) -> dict[str, float]:
        out = dict.fromkeys(("fit_n", "fit_j", "fit_p", "fit_t", "fit_jj", "fit_jp", "fit_pp", "fit_jt", "fit_pt"), 0.0)
        for j, p in calls:
            t = c + a * j + b * p
            for key, v in (("n", 1), ("j", j), ("p", p), ("t", t), ("jj", j * j), ("jp", j * p), ("pp", p * p),
                           ("jt", j * t), ("pt", p * t)):
                out[f"fit_{key}"] += v
        return out

    prompt = [(j, j * tokens) for j in range(1, 40, 3) for tokens in (2, 9, 30)] * 20
    a, b = fit_cpu_rates(sums(prompt, 3_000.0, 120_000.0, 7_000.0), prior=(50_000.0, 1_000.0))
    assert abs(a - 120_000) / 120_000 < 0.05 and abs(b - 7_000) / 7_000 < 0.05
    decode = [(j, j) for j in (1, 2, 3)] * 100
    a, b = fit_cpu_rates(sums(decode, 3_000.0, 120_000.0, 7_000.0), prior=(100_000.0, 5_000.0))
    assert a >= 0 and b >= 0 and abs((a + b) - 127_000) / 127_000 < 0.1
    assert fit_cpu_rates(sums([], 0, 0, 0), prior=(1.0, 2.0)) == (1.0, 2.0)


def test_the_host_function_feeds_the_fit_and_the_share_refits(kernel: CpuExperts) -> None:
    """Each call adds its sample under the sequence number; `refit_rates` moves the prompt
    rule's rates from the start-up estimates to what the calls took."""
    store = bf16_store()
    share = DeviceOffloadExecutor(store, CPU, F.silu, L, 2, max_tokens=32, cpu_experts_per_layer=0,
                                  cpu_kernel=kernel, prompt_cpu=True)
    cs = share.cpu_share
    cs.rows, cs.prompt_rows = 2, 32
    cs.rates.copy_(torch.tensor([1, 1, 10**9, 0]))  # the device "slow": the CPU takes every miss it can
    before = list(cs.rate_ns)
    steps = 0
    for x, ids, w in routings(seed=11, dtype=torch.bfloat16, steps=10):
        for layer in range(L):
            share.forward(layer, x, ids, w)
        steps += 1
    sums = cs.mailboxes.fit_sums()
    calls = int(cs.mailboxes.busy()[0].sum())
    assert calls > 0 and 0.9 * calls <= sums["fit_n"] <= calls  # decayed a little
    assert sums["fit_p"] >= sums["fit_j"] > 0 and sums["fit_t"] > 0
    share.before_step(0.0, None)  # a prompt step comes: the share refits
    assert cs.rate_ns != before and cs.rate_ns[0] >= 0 and cs.rate_ns[1] >= 0
    assert cs.rates.tolist() == cs.rate_ns and share.stats.snapshot()["cpu_ns_per_expert"] == cs.rate_ns[0]
