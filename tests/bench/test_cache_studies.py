"""Cache studies end to end: `--routing synthetic` replaces the router's ids in the
engine (every routed set is the process's), is labelled in the stats and the bench row,
`bench decode` replays its decode trace through both LRUs, LFU and Belady, and `serve`
refuses it."""

from __future__ import annotations

import pytest

from edgemoe import LLM, SamplingParams
from edgemoe.bench.decode import _print_row, measure
from edgemoe.cli import main

SYNTHETIC = "synthetic:seed=4"


def test_bench_row_is_labelled_and_replays_the_decode_trace(qwen3_ckpt) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", moe_slots=3, routing=SYNTHETIC) as llm:
        label = llm.engine.runtime.routing
        assert label.startswith("synthetic:seed=4,")
        row = measure(llm, 6, 1, 12, seed=1)
        stats = llm.stats()
    assert row["routing"] == stats["routing"] == stats["moe"]["routing"] == label
    replay = row["cache_replay"]
    assert replay["slots"] == 3 and replay["routing"] == label
    assert replay["accesses"] == 12 * 3  # decode steps x MoE layers of the tiny model
    for policy in ("lru", "lru-plain", "lfu", "belady"):
        r = replay[policy]
        assert r["hits_all"] + r["misses_all"] == sum(2 for _ in range(replay["accesses"]))  # top-k 2, batch 1
    assert replay["belady"]["hits_all"] >= max(replay[p]["hits_all"] for p in ("lru", "lru-plain", "lfu"))
    assert 0 <= row["decode_moe"]["hit_rate"] <= 1 and replay["engine_decode_hit_rate"] == row["decode_moe"]["hit_rate"]


def test_synthetic_ids_replace_the_routers(qwen3_ckpt) -> None:  # noqa: ANN001
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    traces = {}
    for routing in ("router", SYNTHETIC, SYNTHETIC):
        with LLM(str(qwen3_ckpt), dtype="float32", routing=routing) as llm:
            trace = llm.engine.runtime.trace
            trace.start()
            llm.generate([[9707, 11, 1879]], greedy)
            traces.setdefault(routing, []).append(trace.stop())
    router, (first, second) = traces["router"][0], traces[SYNTHETIC]
    assert first == second  # seeded: the same run routes the same way
    assert len(first) == len(router) and first != router


@pytest.mark.parametrize("expert_cache", ["host", "device"])
def test_padded_decode_draws_the_unpadded_runs_ids(qwen3_ckpt, expert_cache: str) -> None:  # noqa: ANN001
    """Decode batches padded as on a GPU (3 sequences → 4, the shapes CUDA graphs replay):
    the padding row draws nothing and keeps the router's ids, which neither cache routes,
    so tokens, the recorded trace and the cache's counts are the unpadded run's."""
    from edgemoe.engine.graphs import DecodePadding

    prompts = [[9707, 11, 1879], [1, 2, 3, 4, 5], [42, 43]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def run(padded: bool, **settings):  # noqa: ANN003, ANN202
        with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", moe_slots=3, routing=SYNTHETIC,
                 **settings) as llm:
            rt = llm.engine.runtime
            if padded:
                rt.runner.padding = DecodePadding([1, 2, 4], rt.page_table.scratch_row, rt.pool.scratch_page)
            rt.trace.start()
            tokens = [o.token_ids for o in llm.generate(prompts, greedy)]
            return tokens, rt.trace.stop(), llm.stats()["moe"], rt.runner.routing.staged.rows

    want, want_trace, want_moe, _ = run(False, expert_cache="host")
    tokens, trace, moe, rows = run(True, expert_cache=expert_cache)
    assert rows == 4  # the last step was padded
    assert tokens == want and trace == want_trace
    for key in ("hits", "misses", "bytes_copied", "hit_rate_by_layer"):
        assert moe[key] == want_moe[key], key
    assert moe["misses"] > 0


def test_router_is_the_default_and_labelled(qwen3_ckpt) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32") as llm:
        assert llm.stats()["routing"] == "router" and llm.engine.runtime.runner.routing is None


def test_serve_refuses_synthetic_routing(capsys) -> None:  # noqa: ANN001
    assert main(["serve", "--routing", "synthetic"]) == 2
    err = capsys.readouterr().err
    assert "serve refuses it" in err and "routing (--routing) 'synthetic'" in err


def test_bad_routing_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"routing \(--routing\) 'synth'"):
        LLM(routing="synth")


def test_a_cpu_share_is_replayed_with_its_admission_rule(qwen3_ckpt, capsys, c_expert_kernel) -> None:  # noqa: ANN001
    """The device cache with a fixed CPU quota: the row replays the run's policy with the
    share at the quota the CPU took (its misses never loaded), beside plain LRU."""
    with LLM(str(qwen3_ckpt), dtype="bfloat16", moe_backend="hybrid", expert_cache="device", moe_slots=3,
             cpu_experts_per_layer=1, routing=SYNTHETIC) as llm:
        row = measure(llm, 6, 1, 12, seed=1)
    replay, moe = row["cache_replay"], row["decode_moe"]
    assert moe["experts_cpu"] > 0
    share = replay["share"]
    assert share["policy"] == "lru+share" and share["quota_per_layer"] == 1.0
    assert share["hits_all"] + share["misses_all"] == replay["lru"]["hits_all"] + replay["lru"]["misses_all"]
    _print_row(row)
    assert f"lru+share@1 {share['hit_rate']:.3f}" in capsys.readouterr().out


def test_a_live_share_is_replayed_at_its_fraction_of_the_misses(qwen3_ckpt, capsys, c_expert_kernel) -> None:  # noqa: ANN001
    """The live share (no fixed quota) splits each layer's own misses: the row replays the
    policy with the share at the part of the misses the CPU took."""
    with LLM(str(qwen3_ckpt), dtype="bfloat16", moe_backend="hybrid", expert_cache="device", moe_slots=3,
             routing=SYNTHETIC) as llm:
        row = measure(llm, 6, 1, 12, seed=1)
    replay, moe = row["cache_replay"], row["decode_moe"]
    assert moe["experts_cpu"] > 0
    share = replay["share"]
    part = round(16 * moe["experts_cpu"] / moe["misses"]) / 16  # the CPU's part of the misses, in sixteenths
    assert share["policy"] == "lru+share" and share["fraction_of_misses"] == part > 0
    assert share["hits_all"] + share["misses_all"] == replay["lru"]["hits_all"] + replay["lru"]["misses_all"]
    _print_row(row)
    assert f"lru+share@{part:g} of the misses {share['hit_rate']:.3f}" in capsys.readouterr().out
