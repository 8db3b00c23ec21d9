"""`edgemoe bench decode`: phases timed apart, no prefix-cache reuse between runs,
expert traffic per phase adding up to the run's, and non-positive settings refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from edgemoe import LLM
from edgemoe.bench.decode import TRAFFIC, measure
from edgemoe.cli import main


@pytest.mark.parametrize("flag", ["--prompt-tokens", "--decode-tokens", "--batch-sizes"])
@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_non_positive_settings_are_refused_by_flag(flag: str, value: str, capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as e:
        main(["bench", "decode", flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"argument {flag}:" in err and "Traceback" not in err
    assert ("positive integer" if value != "x" else "not an integer") in err


@pytest.fixture(scope="module")
def llm(qwen3_ckpt):  # noqa: ANN001, ANN201
    # Offload with a pool of a third of the experts: misses in both phases.
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", moe_slots=8) as llm:
        measure(llm, 4, 1, 2, seed=99)  # warm-up
        yield llm


def traffic(llm: LLM) -> dict[str, float]:
    moe = llm.stats()["moe"]
    return {k: moe[k] for k in TRAFFIC}


@pytest.mark.parametrize("prompt_tokens,batch,decode_tokens", [(12, 1, 5), (20, 3, 4)])
def test_phases_are_timed_apart(llm: LLM, prompt_tokens: int, batch: int, decode_tokens: int) -> None:
    before, t0 = traffic(llm), time.perf_counter()
    row = measure(llm, prompt_tokens, batch, decode_tokens, seed=prompt_tokens)
    wall, after = time.perf_counter() - t0, traffic(llm)
    # every prompt fits one prefill step: first tokens all come from it, then one token per request per step
    assert row["decode_steps"] == decode_tokens
    assert row["decode_tokens_timed"] == batch * decode_tokens
    assert 0 < row["prefill_s"] and 0 < row["decode_s"] and row["prefill_s"] + row["decode_s"] <= wall
    # The rate leaves out the first step (with overlap, one launched in the prefill phase):
    # the other steps' tokens over their time, a step's tokens the batch.
    assert row["decode_tok_s"] >= batch * (decode_tokens - 1) / wall  # never the old "second run minus first"
    assert row["decode_tok_s"] * row["decode_step_ms"] / 1000 == pytest.approx(batch)
    assert row["decode_step_ms"] == pytest.approx(sum(row["decode_step_ms_each"][1:]) / (decode_tokens - 1), abs=0.01)
    assert row["decode_step_ms_p50"] <= row["decode_step_ms_max"] <= 1000 * row["decode_s"]
    assert row["cached_prompt_tokens"] == 0
    # tokens through the MoE layers: the prompts in prefill, the fed-back tokens in decode
    assert row["prefill_moe"]["tokens"] == batch * prompt_tokens
    assert row["decode_moe"]["tokens"] == batch * decode_tokens
    for key in ("misses", "tokens"):  # the phases account for the whole run
        per_phase = [
            row[p]["misses_per_token"] * row[p]["tokens"] if key == "misses" else row[p]["tokens"]
            for p in ("prefill_moe", "decode_moe")
        ]
        assert sum(per_phase) == pytest.approx(after[key] - before[key])  # a float64 product/division
    assert row["prefill_moe"]["misses_per_token"] > 0 and row["decode_moe"]["misses_per_token"] > 0
    # offload: every expert read from host memory is a copy
    assert row["decode_expert_read_gb_s"] == pytest.approx(row["decode_moe"]["gb_copied"] / row["decode_s"])
    assert row["decode_expert_read_gb_s"] > 0


def test_every_request_decodes_in_every_timed_step_after_a_chunked_prefill(qwen3_ckpt) -> None:  # noqa: ANN001
    # 3 prompts of 40 tokens, 16 prefilled per step: the first request has its first token
    # steps before the last and decodes meanwhile; the timed steps still carry all three.
    with LLM(str(qwen3_ckpt), dtype="float32", max_prefill_tokens=16) as small:
        row = measure(small, 40, 3, 4, seed=5)
    assert row["decode_steps"] == 4 and row["decode_tokens_timed"] == 3 * 4


def test_runs_do_not_reuse_each_others_prefix(llm: LLM) -> None:
    assert measure(llm, 40, 2, 2, seed=1)["cached_prompt_tokens"] == 0
    assert measure(llm, 40, 2, 2, seed=2)["cached_prompt_tokens"] == 0
    # the control: the same prompts again are served from the prefix cache
    assert measure(llm, 40, 2, 2, seed=2)["cached_prompt_tokens"] > 0


def test_measure_refuses_non_positive_settings(llm: LLM) -> None:
    with pytest.raises(ValueError, match="positive"):
        measure(llm, 8, 1, 0, seed=0)


def test_cli_writes_one_row_per_setting_on_the_demo_model(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    argv = ["bench", "decode", "--prompt-tokens", "8", "--batch-sizes", "1", "2", "--decode-tokens", "3",
            "--max-model-len", "256", "--out", str(tmp_path)]
    assert main(argv) == 0
    (result,) = tmp_path.glob("decode-*.json")
    assert result.with_suffix(".png").exists()
    rows = json.loads(result.read_text())["rows"]
    assert [(r["prompt_tokens"], r["batch"]) for r in rows] == [(8, 1), (8, 2)]
    assert all(r["decode_tokens_timed"] == 3 * r["batch"] and r["cached_prompt_tokens"] == 0 for r in rows)
    assert capsys.readouterr().out.count("decode ") >= 2


def test_with_overlap_the_first_decode_step_runs_in_the_prefill_phase(qwen3_ckpt) -> None:  # noqa: ANN001
    """Overlap launches decode step 1 before the prefill's first tokens are read: its expert
    traffic counts in the prefill phase; the decode phase still times every token, and its
    last step launches the next (the requests run on past the timed steps)."""
    batch, prompt_tokens, decode_tokens = 2, 12, 4
    with LLM(str(qwen3_ckpt), dtype="float32", overlap=True) as llm:
        before = traffic(llm)
        row = measure(llm, prompt_tokens, batch, decode_tokens, seed=5)
        after, loop = traffic(llm), llm.engine.overlap
    assert row["decode_steps"] == decode_tokens and row["decode_tokens_timed"] == batch * decode_tokens
    assert row["prefill_moe"]["tokens"] == batch * (prompt_tokens + 1)
    assert row["decode_moe"]["tokens"] == batch * decode_tokens  # each timed step launched one
    assert after["tokens"] - before["tokens"] == batch * (prompt_tokens + 1 + decode_tokens)
    # every timed step's host phases were recorded (engine/step_anatomy.py), and the loop let go of the record
    phases = row["decode_phase_ms"]
    assert set(phases) == {"schedule_ms", "launch_ms", "complete_ms", "gc_ms", "gc_collections", "switches"}
    assert 0 < phases["schedule_ms"] + phases["launch_ms"] + phases["complete_ms"] <= 1000 * row["decode_s"]
    assert all(set(s) >= {"step", "ms", "launch_ms", "gc_ms"} for s in row["decode_slow_steps"])
    assert loop.anatomy is None


def test_prefetch_traffic_counts_recall_precision_and_unused_bytes() -> None:
    from edgemoe.bench.prefetch_report import prefetch_traffic

    before = {"prefetched": 10, "prefetch_used": 6}
    after = {"prefetch": "router", "prefetched": 30, "prefetch_used": 21}
    # 20 prefetched (15 used) among 50 misses, 5 of them the CPU's: 45 copies of 2 bytes each.
    d = {"misses": 50, "experts_cpu": 5, "bytes_copied": 90}
    got = prefetch_traffic(before, after, d)
    assert got["prefetched"] == 20 and got["prefetch_used"] == 15
    assert got["prefetch_precision"] == 15 / 20
    assert got["prefetch_recall"] == 15 / (15 + 30)  # the 30 misses prefetch didn't cover, CPU's included
    assert got["prefetch_recall_copies"] == 15 / (15 + 25)  # the copied misses alone
    assert got["gb_prefetched_unused"] == 5 * 2 / 1e9


def test_prefetch_auto_choice_reaches_the_row_and_its_line() -> None:
    from edgemoe.bench.prefetch_report import prefetch_note, prefetch_traffic

    after = {"prefetch": "router", "prefetched": 0, "prefetch_used": 0, "prefetch_auto": "off",
             "prefetch_auto_step_ms": {"on": 9.1, "off": 8.4}, "prefetch_auto_windows": 8, "prefetch_auto_verdicts": 1}
    got = prefetch_traffic({}, after, {"misses": 50, "experts_cpu": 0, "bytes_copied": 90})
    assert got["prefetch_auto"] == "off" and got["prefetch_auto_step_ms"] == {"on": 9.1, "off": 8.4}
    assert prefetch_note(got) == ", prefetch auto: off after 1 verdicts (on 9.10 ms, off 8.40 ms)"


def test_the_rate_leaves_out_the_first_step() -> None:
    """A first step of 2 ms (with overlap: a step launched during the prefill phase) and three
    of 16 ms, two tokens each: 6 tokens in 48 ms, not 8 in 50."""
    from edgemoe.bench.decode import Phase, steady_rate

    phase = Phase(seconds=0.050, tokens=8, step_seconds=[0.002, 0.016, 0.016, 0.016], step_tokens=[2, 2, 2, 2])
    rate = steady_rate(phase)
    assert (rate.tokens, rate.steps) == (6, 3) and rate.seconds == pytest.approx(0.048)
    one = Phase(seconds=0.016, tokens=2, step_seconds=[0.016], step_tokens=[2])
    assert steady_rate(one) == steady_rate(one).__class__(2, 0.016, 1)  # one step: nothing to leave out


def test_expert_reads_count_the_copies_and_the_cpus_experts() -> None:
    from edgemoe.bench.decode import expert_read_gb_s

    moe = {"gb_copied": 0.5, "experts_cpu": 100}
    assert expert_read_gb_s(moe, 10_000_000, 0.5) == pytest.approx((0.5 + 1.0) / 0.5)
    assert expert_read_gb_s(moe, 10_000_000, 0.0) == 0.0


def test_the_printed_row_says_each_phases_cpu_experts(capsys) -> None:  # noqa: ANN001
    """The CPU's experts a token beside each phase's misses (the prompt rule's in prefill,
    the quota's in decode), and nothing where the CPU took none."""
    from edgemoe.bench.decode import _print_row

    row = {"prompt_tokens": 512, "batch": 1, "prefill_tok_s": 1500.0, "prefill_s": 0.34, "decode_tok_s": 50.0,
           "decode_step_ms": 20.0, "prefill_moe": {"misses_per_token": 8.34, "experts_cpu": 1408, "tokens": 512},
           "decode_moe": {"misses_per_token": 132.0, "experts_cpu": 0, "tokens": 64}}
    _print_row(row)
    out = capsys.readouterr().out
    assert "misses/token prefill 8.34 (CPU 2.75) decode 132.00" in out and out.count("(CPU") == 1
    assert "read from host memory" not in out  # rows without the figure
    _print_row({**row, "decode_expert_read_gb_s": 110.44})
    assert ", 110.4 GB/s of experts read from host memory" in capsys.readouterr().out


@pytest.mark.parametrize("argv,flag", [
    (["bench", "bw", "--seconds", "-1"], "--seconds"),
    (["bench", "bw", "--read-gib", "nan"], "--read-gib"),
    (["bench", "bw", "--threads", "0"], "--threads"),
    (["bench", "agent", "--turns", "0"], "--turns"),
    (["bench", "moe-quant", "--slots", "-2"], "--slots"),
    (["bench", "decode", "--out", "/dev/null/results"], "--out"),
])
def test_every_bench_refuses_bad_numbers_and_unwritable_folders_by_flag(argv: list[str], flag: str,
                                                                         capsys) -> None:  # noqa: ANN001
    """At parse time, naming the flag (a bad --out once failed with a traceback after the whole run;
    --seconds -1 and --turns 0 ran)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}:" in err and "Traceback" not in err


@pytest.mark.parametrize("limit", [["--kv-tokens", "4"], ["--max-model-len", "12"]])
def test_a_run_that_fits_is_not_refused_by_the_warm_up(limit: list[str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The warm-up's own 16-token prompt failed where the asked-for runs fit: "the prompt has
    16 tokens, the KV cache holds 16" (or "the context length is 12"), naming no flag."""
    assert main(["bench", "decode", "--model", "random:tiny-qwen3-moe", *limit, "--prompt-tokens", "4",
                 "--batch-sizes", "1", "--decode-tokens", "2", "--out", str(tmp_path)]) == 0
    assert len(json.loads(next(tmp_path.glob("decode-*.json")).read_text())["rows"]) == 1
    assert "Traceback" not in capsys.readouterr().err
