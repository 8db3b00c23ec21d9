"""Greedy tokens do not depend on where experts run (CPU, simulated device pool)."""

from __future__ import annotations

import pytest
import torch

from edgemoe import LLM, SamplingParams

PROMPTS = [[9707, 11, 1879], list(range(3000, 3030)), [151644, 872, 198, 3838, 374]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
TOP_K, EXPERTS, MOE_LAYERS = 2, 8, 3  # the tiny qwen3_moe checkpoint


@pytest.fixture(scope="module")
def resident_tokens(qwen3_ckpt):  # noqa: ANN001, ANN201
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="resident") as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize(
    "settings",
    [
        dict(moe_backend="offload", moe_slots=TOP_K),
        dict(moe_backend="offload", moe_slots=EXPERTS * MOE_LAYERS // 4),
        dict(moe_backend="offload", moe_slots=EXPERTS * MOE_LAYERS),
        dict(moe_backend="offload", moe_slots=5, moe_policy="lfu"),
        dict(moe_backend="offload", moe_slots=5, moe_policy="lru-plain"),  # the A/B policy (lru: the default)
        dict(moe_backend="cpu", moe_slots=TOP_K),
        dict(moe_backend="hybrid", moe_slots=4, moe_hybrid_fraction=0.5),
        dict(moe_backend="hybrid", moe_slots=4),  # the live controller
        dict(moe_backend="offload", moe_slots=4, expert_store="mmap"),
        dict(moe_backend="cpu", moe_slots=4, expert_store="mmap"),
    ],
    ids=lambda s: "-".join(str(v) for v in s.values()),
)
def test_backend_gives_resident_tokens(qwen3_ckpt, resident_tokens, settings) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", max_prefill_tokens=11, **settings) as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        stats = llm.stats()
    assert got == resident_tokens
    moe = stats["moe"]
    assert stats["moe_backend"] == settings["moe_backend"]
    assert moe["hits"] + moe["misses"] > 0 and moe["tokens"] > 0
    assert len(moe["misses_per_token_by_layer"]) == MOE_LAYERS
    if settings.get("moe_slots", 0) < EXPERTS * MOE_LAYERS:
        assert moe["misses"] > 0
    if settings["moe_backend"] == "cpu" or settings.get("moe_hybrid_fraction"):
        assert moe["experts_cpu"] > 0
    elif settings["moe_backend"] == "hybrid":  # the controller's split: whatever it chose, accounted
        assert moe["split"]["layers"] > 0 and moe["experts_cpu"] == round(moe["split"]["cpu_share"] * moe["split"]["misses"])
    elif settings["moe_slots"] < EXPERTS * MOE_LAYERS:
        assert moe["bytes_copied"] > 0
    else:  # a pool for every expert: the start-up preload (--expert-preload auto) holds them all
        assert moe["bytes_copied"] == 0 and moe["preloaded_experts"] == EXPERTS * MOE_LAYERS


def test_slots_below_top_k_are_refused(qwen3_ckpt) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=r"moe_slots \(--moe-slots\) must be at least num_experts_per_tok = 2"):
        LLM(str(qwen3_ckpt), moe_backend="offload", moe_slots=1)


def test_mmap_store_maps_instead_of_reading(qwen3_ckpt) -> None:  # noqa: ANN001
    from edgemoe.models.loader import load_checkpoint
    from edgemoe.moe.mmap_store import MmapStore

    loaded = load_checkpoint(qwen3_ckpt, expert_store="mmap", progress=False)
    store = loaded.experts
    assert isinstance(store, MmapStore) and not store.missing()
    ram = load_checkpoint(qwen3_ckpt, progress=False).experts
    for layer in store.layers:
        for e in (0, EXPERTS - 1):
            for a, b in zip(store.expert(layer, e), ram.expert(layer, e), strict=True):
                assert torch.equal(a, b)


def _run(path, **settings):  # noqa: ANN001, ANN003, ANN202
    with LLM(str(path), dtype="float32", max_prefill_tokens=11, **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.stats()["moe"]


@pytest.mark.parametrize(
    "settings",
    [
        # Few runs (two engines each): the executor tests cover more pool sizes and both movers.
        dict(moe_slots=TOP_K),  # the minimum pool: prompt chunks run in waves
        dict(moe_slots=4, expert_mover="copy"),
        dict(moe_slots=4, expert_dtype="int8"),  # quantised banks: every part gathered
    ],
    ids=lambda s: "-".join(str(v) for v in s.values()),
)
def test_device_cache_gives_the_host_cache_tokens_and_stats(qwen3_ckpt, resident_tokens, settings) -> None:  # noqa: ANN001
    host_tokens, host = _run(qwen3_ckpt, moe_backend="offload", **{k: v for k, v in settings.items() if k != "expert_mover"})
    tokens, dev = _run(qwen3_ckpt, moe_backend="offload", expert_cache="device", **settings)
    assert tokens == host_tokens
    if "expert_dtype" not in settings:
        assert tokens == resident_tokens
    for key in ("hits", "misses", "bytes_copied", "tokens", "hit_rate_by_layer"):
        assert dev[key] == host[key], key
    assert dev["misses"] > 0 and dev["expert_cache"] == "device"


def test_device_cache_settings_are_checked() -> None:
    from edgemoe.config import EngineConfig

    with pytest.raises(ValueError, match="lru or lru-plain only"):
        EngineConfig.from_kwargs(expert_cache="device", moe_policy="lfu")
    EngineConfig.from_kwargs(expert_cache="device", moe_backend="hybrid", moe_hybrid_fraction=0.5)  # a fixed share
    EngineConfig.from_kwargs(expert_cache="device", moe_backend="hybrid")  # a live CPU quota
    with pytest.raises(ValueError, match="not 'cpu'"):
        EngineConfig.from_kwargs(expert_cache="device", moe_backend="cpu")
    EngineConfig.from_kwargs(expert_cache="device", moe_backend="hybrid", cpu_experts_per_layer=2)
    with pytest.raises(ValueError, match="expert-mover"):
        EngineConfig.from_kwargs(expert_cache="device", expert_mover="dma")


def test_padded_decode_batches_give_the_host_cache_tokens_and_stats(qwen3_ckpt, resident_tokens) -> None:  # noqa: ANN001
    """Decode batches padded as on a GPU (3 sequences → 4): the device cache learns the live
    rows from the runner, inside the step, and routes nothing for the padding row."""
    from edgemoe.engine.graphs import DecodePadding

    def run(**settings):  # noqa: ANN003, ANN202
        with LLM(str(qwen3_ckpt), dtype="float32", max_prefill_tokens=11, moe_backend="offload", moe_slots=6,
                 **settings) as llm:
            rt, masks = llm.engine.runtime, []
            rt.runner.padding = DecodePadding([1, 2, 4], rt.page_table.scratch_row, rt.pool.scratch_page)
            hand_on = rt.runner.live_rows
            rt.runner.live_rows = lambda live: (masks.append(live), hand_on(live))
            tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
            return tokens, llm.stats()["moe"], masks

    host_tokens, host, _ = run()
    tokens, dev, masks = run(expert_cache="device")
    assert tokens == host_tokens == resident_tokens
    assert any(m is not None and not bool(m.all()) for m in masks)  # a padding row was masked
    for key in ("hits", "misses", "bytes_copied"):
        assert dev[key] == host[key], key
    assert dev["hits"] > 0 and dev["misses"] > 0


def test_a_replayed_decode_forward_routes_its_rows_and_its_capture_nothing(qwen3_ckpt) -> None:  # noqa: ANN001
    """A graph's forward is recorded on filler rows and replayed on the static buffers
    rewritten: emulated on the CPU by running the capture batch (its host metadata frozen:
    every row padding) again after the buffers hold a real row. The capture must leave the
    expert cache alone and the replay must route every real row (H200, 2026-12-03: with
    the one-row batch's mask skipped, the frozen padding count made every replay route
    nothing: 0 misses a token)."""
    from edgemoe.engine.batch_buffers import SeqChunk
    from edgemoe.engine.graphs import DecodePadding

    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", moe_slots=6, expert_cache="device") as llm:
        rt = llm.engine.runtime
        padding = DecodePadding([1, 2, 4], rt.page_table.scratch_row, rt.pool.scratch_page)
        rt.runner.padding = padding

        def routed(batch) -> int:  # noqa: ANN001
            before = llm.stats()["moe"]
            rt.runner.run_batch(batch)
            after = llm.stats()["moe"]
            return after["hits"] + after["misses"] - before["hits"] - before["misses"]

        real = SeqChunk(0, 0, (9707,), (0,), in_prompt=False, wants_logits=True)
        for size in padding.sizes:
            captured = rt.runner.buffers.build(padding.pad([], size))
            assert routed(captured) == 0, size  # the capture's filler rows touch nothing
            rt.runner.buffers.build(padding.pad([real], size))  # a replay's rows, in place
            assert routed(captured) == 3 * 2, size  # 3 MoE layers x top-2 for the one real row


def test_a_pool_below_one_tokens_experts_is_warned_about(qwen3_ckpt, caplog) -> None:  # noqa: ANN001
    """3 MoE layers x top-2 = 6 experts a token: 4 slots warn at start-up, 6 do not."""
    for slots, warned in ((4, True), (6, False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="edgemoe.engine.build"), \
                LLM(str(qwen3_ckpt), moe_backend="offload", moe_slots=slots):
            pass
        assert any("smaller than one token's experts" in r.getMessage() for r in caplog.records) == warned


def test_hybrid_on_the_device_cache_runs_a_live_cpu_quota(qwen3_ckpt, c_expert_kernel) -> None:  # noqa: ANN001
    """Through the engine: the runner tells the executor each step's start (its controller
    times decode steps); hybrid starts with one CPU expert a layer, counted as misses."""
    with LLM(str(qwen3_ckpt), dtype="bfloat16", moe_backend="hybrid", expert_cache="device", moe_slots=4) as llm:
        llm.generate(PROMPTS, GREEDY)
        moe = llm.stats()["moe"]
        ctl = llm.engine.runtime.executor.controller
    assert ctl is not None and moe["expert_cache"] == "device"
    assert moe["experts_cpu"] > 0 and moe["cpu_calls"] > 0
    # In the live scale's unit (the fraction of each layer's misses by default, sixteenths):
    # level / 4 held only while the controller sat at level 0.
    assert moe["cpu_quota_unit"] == ctl.scale.unit
    assert moe["cpu_quota_per_layer"] == ctl.level / ctl.scale.per_unit and moe["cpu_quota_windows"] == ctl.windows


def test_prompt_cpu_runs_prompt_chunks_through_the_share(qwen3_ckpt, c_expert_kernel) -> None:  # noqa: ANN001
    """`--prompt-cpu` through the engine: a prompt chunk over the decode rows takes the
    prompt rule (its CPU experts counted in the prefill), then decode continues."""
    long_prompt = list(range(3000, 3100))  # 100 tokens: one chunk past the 64 decode rows
    with LLM(str(qwen3_ckpt), dtype="bfloat16", moe_backend="hybrid", expert_cache="device", moe_slots=4,
             prompt_cpu=True, max_prefill_tokens=128) as llm:
        llm.engine.runtime.executor.controller.level = 0  # decode without a share: only the prompt rule counts
        out = llm.generate([long_prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        moe = llm.stats()["moe"]
        share = llm.engine.runtime.executor.cpu_share
    assert len(out[0].token_ids) == 1 and moe["prompt_cpu"] is True and share.prompt_rows >= 100
    assert moe["experts_cpu"] > 0 and moe["cpu_ns_per_expert"] >= 0


def test_streamed_prefill_gives_resident_tokens(qwen3_ckpt, resident_tokens, monkeypatch) -> None:  # noqa: ANN001
    # Chunks of 8+ prompt tokens stream their layers' experts through 2·E lent slots.
    monkeypatch.setenv("EDGEMOE_PREFILL_STREAM_TOKENS", "8")
    with LLM(str(qwen3_ckpt), dtype="float32", max_prefill_tokens=11, moe_backend="offload", expert_cache="device",
             moe_slots=2 * EXPERTS + 1) as llm:
        assert llm.engine.runtime.executor.streaming.min_tokens == 8
        got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        moe = llm.stats()["moe"]
    assert got == resident_tokens
    assert moe["streamed_chunks"] >= 2 and moe["misses"] > 0


@pytest.mark.parametrize("cache", ["host", "device"])
def test_preloaded_slots_keep_the_tokens_and_save_misses(qwen3_ckpt, resident_tokens, cache: str) -> None:  # noqa: ANN001
    slots = EXPERTS * MOE_LAYERS // 2
    cold_tokens, cold = _run(qwen3_ckpt, moe_backend="offload", moe_slots=slots, expert_cache=cache,
                             expert_preload="off")
    tokens, warm = _run(qwen3_ckpt, moe_backend="offload", moe_slots=slots, expert_cache=cache)  # auto: on
    assert tokens == cold_tokens == resident_tokens
    assert warm["preloaded_experts"] == slots and "preloaded_experts" not in cold
    assert warm["misses"] < cold["misses"]
    _, mapped = _run(qwen3_ckpt, moe_backend="offload", moe_slots=slots, expert_store="mmap")
    assert "preloaded_experts" not in mapped  # auto: an mmap store would read from disk at start-up
    with pytest.raises(ValueError, match="expert-preload|expert_preload"):
        _run(qwen3_ckpt, moe_backend="offload", moe_slots=slots, expert_preload="yes")
