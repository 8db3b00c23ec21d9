"""Overlap scheduling (`overlap=True`) against the serial loop on the CPU: the same tokens,
texts, finish and stop reasons and logprobs for every request, whatever arrives, stops,
is aborted or preempted while a step is in flight; no output after a finish; every page
and row returned; and the prefix cache holds only accepted tokens' KV."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from tolerances import log_softmax_atol, network_atol

from edgemoe import LLM, SamplingParams
from edgemoe.cache.page_table import PageTable
from edgemoe.engine.batch_buffers import PENDING, BatchBuffers, SeqChunk
from edgemoe.engine.engine import Engine
from edgemoe.messages import RequestOutput, TokenLogprob

PROMPTS = [[9707, 11, 1879], list(range(3000, 3017)), [151644, 872, 198, 3838], list(range(4100, 4109)),
           [5, 6, 7, 8, 9, 10], list(range(8000, 8030))]


def greedy(n: int, **kw: object) -> SamplingParams:
    # seeded: no draw from the engine's generator (whose state the two engines must share)
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, seed=0, **kw)  # type: ignore[arg-type]


def settle(engine: Engine) -> None:
    """Complete a step still in flight (overlap leaves one after a request finishes)."""
    while engine.has_work():
        engine.step()


@pytest.fixture(scope="module")
def pair(qwen3_ckpt) -> Iterator[dict[bool, LLM]]:  # noqa: ANN001
    """The serial and the overlapped engine, same model and settings. NOTE: tests use both
    alike (the same unseeded requests in the same order), so their seed generators agree."""
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=False) as serial, \
            LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=True) as overlapped:
        assert serial.engine.overlap is None and overlapped.engine.overlap is not None
        yield {False: serial, True: overlapped}


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


Arrivals = dict[int, list[tuple[str, list[int], SamplingParams]]]


def drive(engine: Engine, arrivals: Arrivals, aborts: dict[int, list[str]] | None = None) -> dict[str, Result]:
    """Step the engine, adding requests and aborting them before the step of that index;
    checks that a request's outputs stop at its one finished output."""
    results: dict[str, Result] = {}
    done: set[str] = set()

    def record(out: RequestOutput) -> None:
        assert out.request_id not in done, f"{out.request_id}: an output after its finish"
        r = results[out.request_id]
        r.token_ids += out.token_ids
        r.text += out.text
        r.logprobs += out.logprobs or []
        if out.finished:
            done.add(out.request_id)
            r.finish_reason, r.stop_reason = out.finish_reason, out.stop_reason

    step = 0
    while step <= max(arrivals) or engine.has_work():
        for rid, prompt, params in arrivals.get(step, []):
            results[rid] = Result()
            engine.add_request(prompt, params, rid)
        for rid in (aborts or {}).get(step, []):
            if (out := engine.abort(rid)) is not None:
                record(out)
        for out in engine.step():
            record(out)
        step += 1
        assert step < 500, "the engine does not finish"
    assert done == set(results)
    assert_everything_returned(engine)
    return results


def assert_everything_returned(engine: Engine) -> None:
    pool, table = engine.runtime.pool, engine.runtime.page_table
    assert pool.num_free + engine.prefix_cache.total_pages == pool.num_pages
    assert table.num_free == table.max_rows and not engine.requests and not engine.has_work()


def first_new(tokens: list[int], start: int) -> int:
    """The first index >= start whose token did not occur before it."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def test_a_mixed_batch_gives_the_serial_outputs(pair: dict[bool, LLM], monkeypatch: pytest.MonkeyPatch) -> None:
    g = [o.token_ids for o in pair[False].generate(PROMPTS, greedy(12))]
    eos = g[1][first_new(g[1], 3)]  # declared EOS below: greedy wants it mid-sequence
    j = first_new(g[3], 3)
    text5 = pair[False].generate([PROMPTS[5]], greedy(12))[0].text
    batch = [
        (PROMPTS[0], greedy(10, logprobs=3)),
        (PROMPTS[1], SamplingParams(temperature=1.0, top_p=0.9, top_k=40, seed=3, max_tokens=12, ignore_eos=True,
                                    repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3)),
        (PROMPTS[2], SamplingParams(temperature=0.9, min_p=0.01, max_tokens=8, ignore_eos=True)),  # n = 2: engine
        (PROMPTS[2], SamplingParams(temperature=0.9, min_p=0.01, max_tokens=8, ignore_eos=True)),  # drawn seeds
        (PROMPTS[3], greedy(1)),
        (PROMPTS[4], greedy(2)),
        (PROMPTS[5], greedy(12, stop=[text5[len(text5) // 2 : len(text5) // 2 + 2]])),
        (PROMPTS[0], greedy(12, stop_token_ids=[g[0][4]])),
        (PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=12, seed=0)),  # stops at the declared EOS
        (PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=12, min_tokens=8, seed=0)),  # EOS held back
        (PROMPTS[3], greedy(12, stop_token_ids=[g[3][j]], min_tokens=j)),  # stops exactly at min_tokens
        (PROMPTS[1], greedy(12)),  # ignore_eos: past the declared EOS
        (PROMPTS[4], SamplingParams(temperature=0.7, seed=11, max_tokens=9, ignore_eos=True, frequency_penalty=1.5,
                                    logprobs=0)),
    ]
    arrivals: Arrivals = {0: [(f"r{i}", p, params) for i, (p, params) in enumerate(batch)]}
    runs = {}
    for overlap, llm in pair.items():
        monkeypatch.setattr(llm.engine, "eos_ids", llm.engine.eos_ids | {eos})
        runs[overlap] = drive(llm.engine, arrivals)
    serial, overlapped = runs[False], runs[True]
    # The set-up does what it says (else the comparison proves less).
    assert serial["r8"].finish_reason == "stop" and serial["r8"].token_ids[-1] == eos
    assert serial["r10"].token_ids == g[3][: j + 1] and serial["r10"].stop_reason == g[3][j]
    assert serial["r6"].finish_reason == "stop" and serial["r7"].finish_reason == "stop"
    assert len(serial["r9"].token_ids) >= 8 and eos not in serial["r9"].token_ids[:8]
    assert serial["r2"].token_ids != serial["r3"].token_ids
    for rid, want in serial.items():
        got = overlapped[rid]
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == (
            want.token_ids, want.text, want.finish_reason, want.stop_reason), rid
        assert_same_logprobs(pair[False], batch[int(rid[1:])][0], want, got)


def assert_same_logprobs(llm: LLM, prompt: list[int], want: Result, got: Result) -> None:
    """Equal up to the rounding of logits computed in other batch shapes (the two loops
    batch the same requests into different steps)."""
    assert len(got.logprobs) == len(want.logprobs)
    if not want.logprobs:
        return
    logits = llm.prompt_logits(prompt + want.token_ids)
    for i, (w, g) in enumerate(zip(want.logprobs, got.logprobs, strict=True)):
        row = logits[len(prompt) - 1 + i]
        # logits within a network's rounding (hidden 64 is the longest reduction) move a
        # logprob by at most twice that, plus log_softmax's own rounding
        tol = 2 * network_atol(torch.float32, 64, row.abs().max().item())
        tol += log_softmax_atol(torch.float32, row.numel(), abs(w.logprob))
        assert g.token_id == w.token_id and g.logprob == pytest.approx(w.logprob, abs=tol)
        assert [t for t, _ in g.top] == [t for t, _ in w.top]


def test_arrivals_and_aborts_while_a_step_is_in_flight(pair: dict[bool, LLM]) -> None:
    seeded = SamplingParams(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)
    arrivals: Arrivals = {
        0: [("a", PROMPTS[0], greedy(10)), ("b", PROMPTS[1], seeded)],
        2: [("c", PROMPTS[2], greedy(6))],  # while a and b decode
        3: [("d", PROMPTS[3], greedy(1)), ("e", PROMPTS[4], greedy(8))],
    }
    full = drive(pair[False].engine, arrivals)
    # b and e are decoding when aborted; d's only token is in flight (overlap) or done
    aborts = {4: ["b", "d"], 5: ["e"], 6: ["a"]}
    runs = {overlap: drive(llm.engine, arrivals, aborts) for overlap, llm in pair.items()}
    for run in runs.values():
        assert run["c"].token_ids == full["c"].token_ids and run["c"].text == full["c"].text
        for rid in "abde":
            # an aborted request's tokens are a prefix of its whole run's, its text too
            n, got = len(run[rid].token_ids), run[rid]
            assert got.token_ids == full[rid].token_ids[:n] and full[rid].text.startswith(got.text)
            assert got.finish_reason == "abort" or (got.token_ids, got.finish_reason) == (
                full[rid].token_ids, full[rid].finish_reason)
    assert runs[False]["d"].finish_reason == "length" and runs[True]["d"].finish_reason == "abort"
    assert runs[True]["b"].token_ids and runs[True]["e"].finish_reason == "abort"


def test_tiny_kv_cache_preempts_and_finishes_with_length(qwen3_ckpt) -> None:  # noqa: ANN001
    prompts = [list(range(5000 + 40 * i, 5000 + 40 * i + 20)) for i in range(4)]
    with LLM(str(qwen3_ckpt), dtype="float32") as roomy:
        want = [o.token_ids for o in roomy.generate(prompts, greedy(24))]
    # 64 tokens of KV for four 44-token sequences: requests are preempted and recomputed.
    with LLM(str(qwen3_ckpt), dtype="float32", kv_tokens=64, page_size=4, overlap=True) as tight:
        assert [o.token_ids for o in tight.generate(prompts, greedy(24))] == want
        settle(tight.engine)
        assert_everything_returned(tight.engine)
    prompt = list(range(6000, 6040))
    with LLM(str(qwen3_ckpt), dtype="float32", kv_tokens=64, page_size=16, overlap=True) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
        # every KV slot holds a position (64), plus the last sampled token, as in the serial loop
        assert out.finish_reason == "length" and len(prompt) + len(out.token_ids) == 64 + 1
        outs = llm.generate([prompt, prompt[::-1]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
        assert [(o.finish_reason, len(o.token_ids)) for o in outs] == [("length", 25), ("length", 25)]
        settle(llm.engine)
        assert_everything_returned(llm.engine)
    with LLM(str(qwen3_ckpt), dtype="float32", max_model_len=8, overlap=True) as llm:
        out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
        assert out.finish_reason == "length" and len(PROMPTS[0]) + len(out.token_ids) == 8


def test_the_prefix_cache_holds_only_accepted_tokens(qwen3_ckpt) -> None:  # noqa: ANN001
    """A request stopped by a token leaves the step that drew one more in flight; what the
    cache keeps is the serial loop's cache after that stop token was computed: the same
    token ids on the same pages' KV, bit for bit (the same single-request steps)."""
    g = None
    caches = {}
    for overlap in (False, True):
        with LLM(str(qwen3_ckpt), dtype="float32", page_size=1, overlap=overlap) as llm:
            if g is None:
                g = llm.generate([PROMPTS[1]], greedy(12))[0].token_ids
                llm.engine.prefix_cache.reset()
            k = first_new(g, 4)
            # serial: one more token, whose KV is never computed; overlap: stop at token k
            params = greedy(k + 2) if not overlap else greedy(12, stop_token_ids=[g[k]])
            out = llm.generate([PROMPTS[1]], params)[0]
            assert out.token_ids == g[: len(out.token_ids)]
            settle(llm.engine)
            seq = PROMPTS[1] + g[: k + 1]
            m = llm.engine.prefix_cache.match(seq + [0], record=False)
            pool = llm.engine.runtime.pool
            caches[overlap] = (m.num_tokens, pool.k[:, m.pages].clone(), pool.v[:, m.pages].clone())
            # all of it (the stop token's KV too) and nothing more: page size 1, a page a token
            assert m.num_tokens == len(seq) == llm.engine.prefix_cache.total_pages
    assert caches[True][0] == caches[False][0]
    assert torch.equal(caches[True][1], caches[False][1]) and torch.equal(caches[True][2], caches[False][2])


def test_llm_stream_and_generate_with_overlap(pair: dict[bool, LLM]) -> None:
    p = SamplingParams(temperature=0.8, max_tokens=20, seed=3, ignore_eos=True)
    whole = pair[False].generate([PROMPTS[1]], p)[0]
    deltas = list(pair[True].stream(PROMPTS[1], p))
    assert "".join(d.text for d in deltas) == whole.text
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert deltas[-1].finished and sum(d.finished for d in deltas) == 1
    early = pair[True].stream(PROMPTS[0], greedy(20))
    next(early)
    assert pair[True].engine.overlap.in_flight is not None  # type: ignore[union-attr]
    # scoring between steps, a step in flight: the serving path's logits all the same
    assert torch.equal(pair[True].prompt_logits(PROMPTS[3]), pair[False].prompt_logits(PROMPTS[3]))
    early.close()  # aborts the request while its next step is in flight
    assert pair[True].generate([PROMPTS[0]], greedy(5))[0].token_ids == pair[False].generate(
        [PROMPTS[0]], greedy(5))[0].token_ids
    assert not pair[True].engine.has_work()


def test_batch_buffers_fetch_pending_ids_from_the_last_sampled() -> None:
    table = PageTable(4, 8, torch.device("cpu"))
    buffers = BatchBuffers(32, 4, table, 4, overlap=True)
    for row in range(3):
        table.assign()
        table.write(row, 0, [2 * row, 2 * row + 1])
    buffers.keep_sampled(torch.tensor([2, 0], dtype=torch.int32), torch.tensor([77, 55]))
    # a prompt's last token (one token, in the prompt) may lead: the scheduler puts every
    # one-token step first
    chunks = [SeqChunk(1, 3, [42], [2, 3], True, True), SeqChunk(0, 5, [PENDING], [0, 1], False, True),
              SeqChunk(2, 6, [PENDING], [4, 5], False, True), SeqChunk(1, 0, [1, 2, 3], [2], True, True)]
    batch = buffers.build(chunks)
    buffers.fetch_pending(batch)
    assert batch.input_ids.tolist() == [42, 55, 77, 1, 2, 3]  # rows 0 and 2's last draws; the rest as staged
    with pytest.raises(ValueError, match="PENDING"):
        buffers.build([chunks[3], chunks[1]])


def test_a_failed_launch_completes_the_step_in_flight_first(qwen3_ckpt, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", overlap=True) as llm:
        engine = llm.engine
        want = llm.generate([PROMPTS[1]], greedy(6))[0].token_ids
        rid = engine.add_request(PROMPTS[1], greedy(6))
        first = engine.step() + engine.step()  # the prefill, then its first token while the next step runs
        assert [t for o in first for t in o.token_ids] == want[:1]
        real = engine.runner.forward

        def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

        monkeypatch.setattr(engine.runner, "forward", boom)
        other = engine.add_request(PROMPTS[0], greedy(4))
        outs = engine.step()  # this launch fails: the step in flight delivers its token, then both fail
        assert [(o.request_id, o.token_ids, o.finish_reason) for o in outs] == [
            (rid, want[1:2], None), (rid, [], "error"), (other, [], "error")]
        assert "out of memory" in (outs[1].error or "")
        assert_everything_returned(engine)
        monkeypatch.setattr(engine.runner, "forward", real)
        assert llm.generate([PROMPTS[1]], greedy(6))[0].token_ids == want


def test_hybrid_prefix_hits_and_tool_call_snapshots_match_the_serial_loop(
    make_ckpt, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """qwen3_next (GDN state rows, a stateful prefix cache): the next turn resumes from a
    snapshot, and the snapshot frozen after a tool-call opener is the serial loop's, though
    with overlap the opener is still on the device when the step computing it launches."""
    path = make_ckpt("qwen3_next", torch_dtype="float32")
    prompt = [(7 * i * i + 3 * i) % 150000 + 100 for i in range(30)]
    opener: int | None = None
    runs = {}
    for overlap in (False, True):
        with LLM(str(path), dtype="float32", page_size=4, overlap=overlap) as llm:
            engine, cache = llm.engine, llm.engine.prefix_cache
            assert cache.stateful
            if opener is None:
                opener = llm.generate([prompt], greedy(12))[0].token_ids[6]
                cache.reset()
            monkeypatch.setattr(engine.snapshots, "opener_ids", frozenset({opener}))
            frozen: list[list[tuple[str, int]]] = []
            real = cache.freeze_state

            def spy(held, kind: str, real=real, frozen=frozen) -> None:  # noqa: ANN001
                real(held, kind)
                frozen.append(sorted((s.kind, s.num_tokens) for s in held))

            monkeypatch.setattr(cache, "freeze_state", spy)
            out = llm.generate([prompt], greedy(12))[0]
            turn2 = prompt + out.token_ids + [31, 32, 33]
            nxt = llm.generate([turn2, prompt], greedy(8))
            assert nxt[0].num_cached_tokens > len(prompt) and nxt[1].num_cached_tokens > 0
            settle(engine)
            assert_everything_returned(engine)
            runs[overlap] = (out.token_ids, [o.token_ids for o in nxt], frozen)
    assert any(kind == "tool_call" for f in runs[False][2] for kind, _ in f)  # the opener was computed
    assert runs[True] == runs[False]


def test_overlap_is_on_by_default_with_a_gpu_and_off_where_the_host_needs_the_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from edgemoe.engine.build import resolve_overlap

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_overlap(None, cuda, None) and not resolve_overlap(None, cpu, None)
    assert resolve_overlap(True, cpu, None) and not resolve_overlap(False, cuda, None)
    disk_ple, device_ple = SimpleNamespace(hashes_on_device=False), SimpleNamespace(hashes_on_device=True)
    assert resolve_overlap(None, cuda, device_ple)  # type: ignore[arg-type]
    assert not resolve_overlap(None, cuda, disk_ple)  # type: ignore[arg-type]
    assert "hashes n-grams on the host" in caplog.text


def test_padded_decode_batches_read_pending_ids_too(qwen3_ckpt, pair: dict[bool, LLM]) -> None:  # noqa: ANN001
    """Decode batches padded to fixed sizes as on a GPU (the shapes CUDA graphs replay):
    the PENDING ids are gathered over the padded batch, padding rows untouched."""
    from edgemoe.engine.graphs import DecodePadding

    want = [o.token_ids for o in pair[False].generate(PROMPTS[:3], greedy(10))]
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=True) as llm:
        rt = llm.engine.runtime
        rt.runner.padding = DecodePadding([1, 2, 4], rt.page_table.scratch_row, rt.pool.scratch_page)
        assert [o.token_ids for o in llm.generate(PROMPTS[:3], greedy(10))] == want


def test_synthetic_routing_draws_as_the_serial_loop_does(qwen3_ckpt, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """`--routing synthetic` overlaps too: a request stopped by a stop token gets one extra
    step's draws under overlap (its token is dropped), and that must shift no other
    sequence's draws — each sequence draws from its own numbers. Every sequence's draws,
    by the order it started, are the serial loop's (the stopped one's plus that extra step)."""
    drawn: dict[bool, dict[int, list]] = {}
    outputs = {}
    for overlap in (False, True):
        with LLM(str(qwen3_ckpt), dtype="float32", page_size=4, overlap=overlap, routing="synthetic:seed=4") as llm:
            engine = llm.engine
            assert (engine.overlap is not None) == overlap
            routing = engine.runner.routing
            process, per_seq = routing.process, drawn.setdefault(overlap, {})
            make_stream, draw = process.stream, process.tokens

            def stream(ordinal: int = 0, make_stream=make_stream, per_seq=per_seq):  # noqa: ANN001, ANN202
                s = make_stream(ordinal)
                s.ordinal = ordinal
                per_seq[ordinal] = []
                return s

            def tokens(s, n: int, draw=draw, per_seq=per_seq):  # noqa: ANN001, ANN202
                ids = draw(s, n)
                per_seq[s.ordinal].append(ids)
                return ids

            monkeypatch.setattr(process, "stream", stream)
            monkeypatch.setattr(process, "tokens", tokens)
            if overlap is False:
                first = llm.generate([PROMPTS[0]], greedy(8))[0].token_ids
                routing.started = 0  # the measured run's sequences number from 0 in both engines
                per_seq.clear()
            stop = greedy(8, stop_token_ids=[first[2]])
            arrivals: Arrivals = {0: [("a", PROMPTS[0], stop), ("b", PROMPTS[1], greedy(9))],
                                  2: [("c", PROMPTS[3], greedy(7))], 6: [("d", PROMPTS[5], greedy(5))]}
            outputs[overlap] = drive(engine, arrivals)
    assert outputs[True] == outputs[False]
    assert outputs[False]["a"].finish_reason == "stop" and len(outputs[False]["a"].token_ids) == 3
    serial, overlapped = ({k: np.concatenate(v) for k, v in d.items()} for d in (drawn[False], drawn[True]))
    assert sorted(serial) == sorted(overlapped) == [0, 1, 2, 3]
    extra = [k for k in serial if len(overlapped[k]) != len(serial[k])]
    assert extra == [0] and len(overlapped[0]) == len(serial[0]) + 1  # the stopped request's extra step
    for k in serial:
        assert np.array_equal(overlapped[k][: len(serial[k])], serial[k]), k
