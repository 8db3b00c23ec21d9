"""End-to-end engine behaviour through `edgemoe.LLM` on a tiny checkpoint (fp32, CPU)."""

from __future__ import annotations

import weakref

import pytest
import torch
from tolerances import log_softmax_atol, network_atol

from edgemoe import LLM, SamplingParams

PROMPTS = [[9707, 11, 1879], list(range(3000, 3017)), [151644, 872, 198, 3838]]


def greedy(n: int, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llm(qwen3_ckpt):  # noqa: ANN001, ANN201
    with LLM(str(qwen3_ckpt), dtype="float32", page_size=4) as llm:
        yield llm


def test_seeded_sampling_repeats_and_seeds_differ(llm: LLM) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=7, ignore_eos=True)
    a = llm.generate(PROMPTS, p)
    b = llm.generate(PROMPTS[::-1], p)[::-1]  # other batch order, same seed per request
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    c = llm.generate(PROMPTS, SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=8, ignore_eos=True))
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


def test_stream_concatenates_to_generate(llm: LLM) -> None:
    p = SamplingParams(temperature=0.8, max_tokens=20, seed=3, ignore_eos=True)
    whole = llm.generate([PROMPTS[1]], p)[0]
    deltas = list(llm.stream(PROMPTS[1], p))
    assert "".join(d.text for d in deltas) == whole.text
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"


def test_stop_string_across_token_boundary(llm: LLM) -> None:
    full = llm.generate([PROMPTS[0]], greedy(16))[0]
    tok = llm.tokenizer
    pieces = [tok.decode([t]) for t in full.token_ids]
    # Pick a boundary with at least 2 printable chars on each side.
    for i in range(2, len(pieces) - 1):
        left, right = "".join(pieces[:i]), pieces[i]
        if len(pieces[i - 1]) >= 2 and len(right) >= 2 and "\ufffd" not in left + right:
            stop = left[-2:] + right[:2]
            break
    else:
        pytest.skip("no suitable token boundary in this sample")
    out = llm.generate([PROMPTS[0]], greedy(16, stop=[stop]))[0]
    assert out.text == full.text[: full.text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_one_stop_string_may_be_a_plain_str(llm: LLM) -> None:
    """`stop="ab"` is the one string "ab" (as vLLM takes it), not the stops "a" and "b"."""
    full = llm.generate([PROMPTS[0]], greedy(12))[0].text
    pair = next((full[i:i + 2] for i in range(1, len(full) - 1) if full[i] not in full[:i]
                 and full[i:i + 2] not in full[:i + 1]), None)
    if pair is None:
        pytest.skip("no fresh two-character pair in this sample")
    out = llm.generate([PROMPTS[0]], greedy(12, stop=pair))[0]
    assert out.text == full[: full.index(pair)] and out.stop_reason == pair


def test_stop_token_ids_and_min_tokens(llm: LLM) -> None:
    first = llm.generate([PROMPTS[2]], greedy(8))[0].token_ids[0]
    out = llm.generate([PROMPTS[2]], greedy(8, stop_token_ids=[first]))[0]
    assert out.token_ids == [first] and out.finish_reason == "stop" and out.stop_reason == first
    held = llm.generate([PROMPTS[2]], greedy(8, stop_token_ids=[first], min_tokens=4))[0]
    assert first not in held.token_ids[:4] and len(held.token_ids) >= 4


def test_min_tokens_hold_stop_strings_back(llm: LLM) -> None:
    """A stop string in the first `min_tokens` tokens' text does not stop (vLLM's rule):
    the output runs on to the first occurrence ending after them, or to max_tokens."""
    full = llm.generate([PROMPTS[0]], greedy(12))[0]
    stop, k = full.text[:2], 3
    if not stop or len(full.token_ids) < 12:
        pytest.skip("no text in this sample")
    head = llm.engine.tokenizer.tokenizer.decode(full.token_ids[:k])
    out = llm.generate([PROMPTS[0]], greedy(12, stop=[stop], min_tokens=k))[0]
    later = full.text.find(stop, max(0, len(head) - len(stop) + 1))
    assert out.text == (full.text[:later] if later >= 0 else full.text)
    assert len(out.token_ids) > k


def test_min_tokens_holds_eos_back_exactly(make_ckpt) -> None:  # noqa: ANN001
    base = make_ckpt("qwen3_moe")
    with LLM(str(base), dtype="float32") as llm:
        eos = llm.generate([PROMPTS[0]], greedy(1))[0].token_ids[0]
    # The same weights with that token declared EOS: greedy wants to stop at once.
    path = make_ckpt("qwen3_moe", eos_token_id=eos)
    with LLM(str(path), dtype="float32") as llm:
        assert eos in llm.engine.eos_ids
        stop_now = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10))[0]
        assert stop_now.token_ids == [eos] and stop_now.finish_reason == "stop"
        held = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, min_tokens=3))[0]
        assert eos not in held.token_ids[:3] and len(held.token_ids) >= 3
        assert held.finish_reason == "length" or held.token_ids[-1] == eos


def test_logprobs_are_the_raw_model_distribution(llm: LLM) -> None:
    out = llm.generate([PROMPTS[0]], greedy(4, logprobs=3))[0]
    seq = PROMPTS[0] + out.token_ids
    logits = llm.prompt_logits(seq)
    for i, entry in enumerate(out.logprobs or []):
        row = logits[len(PROMPTS[0]) - 1 + i]
        ref = torch.log_softmax(row, -1)
        assert entry.token_id == out.token_ids[i]
        # decode steps vs one prefill: logits within a network's rounding (hidden 64 is the
        # longest reduction), which moves a logprob by at most twice that, plus log_softmax's own
        tol = 2 * network_atol(torch.float32, 64, row.abs().max().item())
        tol += log_softmax_atol(torch.float32, row.numel(), abs(entry.logprob))
        assert entry.logprob == pytest.approx(float(ref[entry.token_id]), abs=tol)
        top_ids = [t for t, _ in entry.top]
        assert top_ids == ref.topk(3).indices.tolist()


def test_preemption_under_a_tiny_kv_pool_keeps_tokens(qwen3_ckpt) -> None:  # noqa: ANN001
    prompts = [list(range(5000 + 40 * i, 5000 + 40 * i + 20)) for i in range(4)]
    with LLM(str(qwen3_ckpt), dtype="float32") as roomy:
        want = [o.token_ids for o in roomy.generate(prompts, greedy(24))]
    # 64 tokens of KV for four 44-token sequences: requests must be preempted and recomputed.
    with LLM(str(qwen3_ckpt), dtype="float32", kv_tokens=64, page_size=4) as tight:
        got = [o.token_ids for o in tight.generate(prompts, greedy(24))]
        pool = tight.engine.runtime.pool
        assert pool.num_free + tight.engine.prefix_cache.total_pages == pool.num_pages
    assert got == want


def test_a_request_outgrowing_the_kv_cache_finishes_with_length(qwen3_ckpt) -> None:  # noqa: ANN001
    # Issue 11 item 2: a KV cache smaller than the context is a normal offload set-up; a
    # request that can't grow (even alone) must end with `length`, never kill the engine.
    prompt = list(range(6000, 6040))
    with LLM(str(qwen3_ckpt), dtype="float32", kv_tokens=64, page_size=16) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
        assert out.finish_reason == "length"
        # Every KV slot holds a position (64), plus the last sampled token, which needs none.
        assert len(prompt) + len(out.token_ids) == 64 + 1
        # Two at once: the younger one is preempted, each still ends with `length`, and the
        # engine keeps serving with every page returned.
        outs = llm.generate([prompt, prompt[::-1]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
        assert [o.finish_reason for o in outs] == ["length", "length"]
        assert [len(o.token_ids) for o in outs] == [25, 25]
        pool = llm.engine.runtime.pool
        assert pool.num_free + llm.engine.prefix_cache.total_pages == pool.num_pages
        assert llm.generate([prompt[:8]], greedy(4))[0].finish_reason == "length"


def test_context_full_finishes_with_length(qwen3_ckpt) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", max_model_len=8) as llm:
        out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
        assert out.finish_reason == "length" and len(PROMPTS[0]) + len(out.token_ids) == 8
        with pytest.raises(ValueError, match="the prompt has 17 tokens, the context length is 8"):
            llm.generate([PROMPTS[1]], greedy(1))


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
        (dict(logprobs=99), "logprobs"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[10**9]), "stop_token_ids"),
    ],
)
def test_bad_sampling_params_are_rejected(llm: LLM, params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        llm.generate([PROMPTS[0]], SamplingParams(**params))
    assert not llm.engine.has_work()


def test_bad_prompts_are_rejected(llm: LLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], greedy(1))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[10**7]], greedy(1))
    for odd in (1.5, True):  # a float id once ran as its integer part
        with pytest.raises(ValueError, match=f"token ids must be integers \\(got {odd!r}\\)"):
            llm.generate([[5, odd]], greedy(1))
    assert not llm.engine.has_work()


def test_unknown_setting_and_bad_values(qwen3_ckpt) -> None:  # noqa: ANN001
    with pytest.raises(TypeError, match="unknown setting.*pagesize"):
        LLM(str(qwen3_ckpt), pagesize=4)
    with pytest.raises(ValueError, match=r"page_size \(--page-size\) must be >= 1"):
        LLM(str(qwen3_ckpt), page_size=0)
    # the Python API's values of the wrong type, named (the CLI's parsers never give them)
    for kw, match in ((dict(max_model_len="big"), r"max_model_len \(--max-model-len\) must be an int or None"),
                      (dict(page_size=2.0), r"page_size \(--page-size\) must be an int \(got 2\.0\)"),
                      (dict(overlap="yes"), r"overlap \(--overlap\) must be a bool or None"),
                      (dict(moe_hybrid_fraction=True), "must be a float or None")):
        with pytest.raises(TypeError, match=match):
            LLM(str(qwen3_ckpt), **kw)
    with pytest.raises(ValueError, match=r"dtype \(--dtype\)='float8'"):
        LLM(str(qwen3_ckpt), dtype="float8")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        LLM("/nonexistent/model")


def test_close_frees_and_many_llms_in_turn(qwen3_ckpt) -> None:  # noqa: ANN001
    for _ in range(3):
        with LLM(str(qwen3_ckpt), dtype="float32") as llm:
            assert llm.generate([PROMPTS[0]], greedy(2))[0].token_ids
        with pytest.raises(RuntimeError, match="closed"):
            llm.generate([PROMPTS[0]], greedy(2))


def test_a_gpu_engine_heap_is_frozen_out_of_full_collections_and_thawed_at_release(monkeypatch) -> None:  # noqa: ANN001
    """A full collection while serving must not scan the engine's (and the libraries')
    objects: ~176K of them, 78 ms on the development VM; the GPU machine's 320-step decode
    runs each had one 90–145 ms step. The release an engine's close (or the next build)
    makes thaws them first, so its collection finds a dropped engine's cycles. A CPU engine
    is not frozen (its step is compute; tests/gpu/test_engines_in_turn_gpu.py checks the
    engine's own freeze and thaw on a GPU)."""
    import gc
    import weakref

    from edgemoe.engine.process_memory import freeze_heap, release_device_memory

    class Node:
        pass

    owners = gc.get_freeze_count()  # the suite freezes its imports (tests/conftest.py)
    freeze_heap(torch.device("cpu"))
    assert gc.get_freeze_count() == owners
    cycle = Node()
    cycle.me = cycle  # garbage only the collector finds, once dropped
    gone = weakref.ref(cycle)
    freeze_heap(torch.device("cuda"))  # the collector's part only: nothing touches CUDA
    assert gc.get_freeze_count() > owners
    del cycle
    gc.collect()
    assert gone() is not None  # frozen: a full collection passes it over
    release_device_memory(torch.device("cpu"))
    assert gc.get_freeze_count() == 0 and gone() is None


def test_release_keeps_a_heap_its_owner_froze_and_still_collects_the_engine() -> None:
    """Only what an engine froze is thawed at release: a process (the test suite, an
    embedding application) that froze its own heap keeps it frozen, and a dropped engine,
    made after the owner's freeze, is collected all the same."""
    import gc
    import weakref

    from edgemoe.engine.process_memory import release_device_memory

    class Node:
        pass

    gc.collect()
    gc.freeze()
    owners = gc.get_freeze_count()
    cycle = Node()
    cycle.me = cycle
    gone = weakref.ref(cycle)
    del cycle
    release_device_memory(torch.device("cpu"))
    # A thaw empties the permanent generation; another thread of the process (a daemon of an
    # earlier test) may free a few frozen objects meanwhile, so "kept" is most of it.
    assert gone() is None and owners > 0 and gc.get_freeze_count() > owners // 2


@pytest.mark.parametrize("held", [False, True])
def test_close_drops_the_model_and_kv_cache(qwen3_ckpt, held: bool) -> None:  # noqa: ANN001
    # What a closed LLM held must be garbage, so the next engine in the process gets its
    # device memory — also while a caller still holds the closed Engine (a script's local).
    llm = LLM(str(qwen3_ckpt), dtype="float32", overlap=True)  # overlap: the loop refers back to the engine
    assert llm.generate([PROMPTS[0]], greedy(2))[0].token_ids
    engine = llm.engine if held else None
    rt = llm.engine.runtime
    gone = [weakref.ref(x) for x in (llm.engine, rt.model, rt.pool.k, rt.executor, rt.runner)]
    del rt
    llm.close()
    alive = [i for i, r in enumerate(gone) if r() is not None]
    assert alive == ([0] if held else []), alive  # only the engine object the caller holds
    if engine is not None:
        engine.close()  # a second close does nothing
        assert engine.requests == {}


def test_device_oom_fails_only_that_step_and_keeps_serving(qwen3_ckpt, monkeypatch) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", moe_backend="offload", moe_slots=4) as llm:
        engine = llm.engine
        want = llm.generate([PROMPTS[1]], greedy(6))[0].token_ids
        real_run = engine.runner.forward

        def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

        monkeypatch.setattr(engine.runner, "forward", boom)
        rid = engine.add_request(PROMPTS[0], greedy(4))
        outs = engine.step()
        assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [(rid, True, "error")]
        assert "out of memory" in (outs[0].error or "")
        pool = engine.runtime.pool
        assert pool.num_free + engine.prefix_cache.total_pages == pool.num_pages
        monkeypatch.setattr(engine.runner, "forward", real_run)
        assert llm.generate([PROMPTS[1]], greedy(6))[0].token_ids == want
