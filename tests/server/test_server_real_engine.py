"""The app over the real engine (demo model, CPU) in a thread: the real sampler's outputs
through the whole server path, checked with the openai SDK's strict types."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion
from server_harness import ServerHarness

from edgemoe.server.config import ServerConfig

USER = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def real(demo_dir: Path) -> Iterator[ServerHarness]:
    from edgemoe.engine.service import build_engine

    engine, ready = build_engine({"model": str(demo_dir), "max_model_len": 1024})
    harness = ServerHarness(engine, ready, ServerConfig()).start(timeout=120)
    yield harness
    harness.stop()


def test_text_usage_and_strict_types(real: ServerHarness) -> None:
    r = httpx.post(f"{real.base_url}/v1/chat/completions",
                   json={"model": "m", "messages": USER, "max_tokens": 6, "ignore_eos": True}, timeout=60)
    completion = ChatCompletion.model_validate(r.json(), strict=True)
    tokens = httpx.post(f"{real.base_url}/v1/tokenize", json={"model": "m", "messages": USER}).json()
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == tokens["count"] and tokens["max_model_len"] == 1024
    assert completion.usage.completion_tokens == 6 and completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens_details is not None


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 1234}])
def test_stream_equals_non_stream(real: ServerHarness, sampling: dict[str, Any]) -> None:
    client = real.openai()
    # Thinking off: the random model's text is all content, so every token is compared.
    kwargs: dict[str, Any] = dict(model="m", messages=USER, max_tokens=24, reasoning_effort="none", **sampling)
    full = client.chat.completions.create(**kwargs)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                       if c.choices)
    assert streamed == full.choices[0].message.content


def test_logprobs_and_n(real: ServerHarness) -> None:
    client = real.openai()
    full = client.chat.completions.create(model="m", messages=USER, max_tokens=5, n=2, seed=9, temperature=1.0,
                                          logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert [c.index for c in full.choices] == [0, 1]
    assert full.usage is not None and full.usage.completion_tokens == 10
    for choice in full.choices:
        entries = choice.logprobs.content if choice.logprobs else []
        assert len(entries) == 5
        assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
        assert all(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in entries)


def test_completions_with_token_prompt(real: ServerHarness) -> None:
    client = real.openai()
    full = client.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=4, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert full.usage is not None and (full.usage.prompt_tokens, full.usage.completion_tokens) == (4, 4)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt=[1, 2, 3, 4], max_tokens=4, temperature=0, stream=True, extra_body={"ignore_eos": True}))
    assert streamed == full.choices[0].text


@pytest.fixture(scope="module")
def real_overlap(demo_dir: Path) -> Iterator[ServerHarness]:
    from edgemoe.engine.service import build_engine

    engine, ready = build_engine({"model": str(demo_dir), "max_model_len": 1024, "overlap": True})
    assert engine.overlap is not None  # type: ignore[attr-defined]
    harness = ServerHarness(engine, ready, ServerConfig()).start(timeout=120)
    yield harness
    harness.stop()


def test_the_engine_process_loop_with_overlap_gives_the_serial_answers(
    real: ServerHarness, real_overlap: ServerHarness
) -> None:
    """The service loop (`run_loop`) driving an overlapped engine: stop strings, n > 1 with
    seeds and logprobs, streaming, all as the serial engine answers them."""
    answers = []
    for harness in (real, real_overlap):
        client = harness.openai()
        greedy = client.chat.completions.create(model="m", messages=USER, max_tokens=16, temperature=0,
                                                reasoning_effort="none")
        text = greedy.choices[0].message.content or ""
        stop = text[len(text) // 2 : len(text) // 2 + 2] or "x"
        stopped = client.chat.completions.create(model="m", messages=USER, max_tokens=16, temperature=0,
                                                 reasoning_effort="none", stop=[stop])
        many = client.chat.completions.create(model="m", messages=USER, max_tokens=6, n=2, seed=9, temperature=1.0,
                                              logprobs=True, top_logprobs=1, extra_body={"ignore_eos": True})
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="m", messages=USER, max_tokens=12, temperature=0.9, seed=4, stream=True, reasoning_effort="none")
            if c.choices)
        answers.append((
            text, stopped.choices[0].message.content, stopped.choices[0].finish_reason,
            [(c.message.content, [e.token for e in (c.logprobs.content if c.logprobs else [])]) for c in many.choices],
            streamed,
        ))
    assert answers[0][2] == "stop" and answers[0][3][0] != answers[0][3][1]  # the set-up does what it says
    assert answers[1] == answers[0]
