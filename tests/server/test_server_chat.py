"""Chat Completions over the scripted engine, driven by the real openai SDK."""

from __future__ import annotations

import json
from typing import Any

import httpx
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from server_harness import ServerHarness
from server_scripts import SCRIPTS

from edgemoe.server.templates import ChatTemplate
from edgemoe.tokenizer import TokenizerBundle

USER = [{"role": "user", "content": "Say something."}]


def raw_chat(h: ServerHarness, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{h.base_url}/v1/chat/completions", json={"model": "m", **body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def raw_chunks(h: ServerHarness, **body: Any) -> list[dict[str, Any]]:
    """Every `data:` payload of a streamed request (strictly validated), and the [DONE]."""
    out = []
    with httpx.stream("POST", f"{h.base_url}/v1/chat/completions",
                      json={"model": "m", "stream": True, **body}, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert line.startswith("data: ")
        chunk = json.loads(line[6:])
        ChatCompletionChunk.model_validate(chunk, strict=True)
        out.append(chunk)
    return out


def test_text_response_validates_strictly(scripted: ServerHarness) -> None:
    data = raw_chat(scripted, messages=USER, max_tokens=8)
    completion = ChatCompletion.model_validate(data, strict=True)
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == "m"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 8
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 8
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 0


def test_stream_concatenates_to_non_streamed_text(scripted: ServerHarness) -> None:
    client = scripted.openai()
    for seed, messages in [(7, USER), (None, [{"role": "user", "content": "[[unicode]]"}])]:
        kwargs: dict[str, Any] = dict(model="m", messages=messages, seed=seed, temperature=0.8, max_tokens=100)
        full = client.chat.completions.create(**kwargs)
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                  if c.choices]
        assert "".join(pieces) == full.choices[0].message.content
    assert full.choices[0].message.content == SCRIPTS["unicode"]


def test_stream_shape_and_usage_chunk(scripted: ServerHarness) -> None:
    chunks = raw_chunks(scripted, messages=USER, max_tokens=5, stream_options={"include_usage": True})
    first, last_choice, usage = chunks[0], chunks[-2], chunks[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert last_choice["choices"][0]["delta"] == {} and last_choice["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    no_usage = raw_chunks(scripted, messages=USER, max_tokens=5)
    assert all("usage" not in c for c in no_usage) and no_usage[-1]["choices"][0]["finish_reason"] == "length"


def test_logprobs_bytes_spell_the_text(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = scripted.openai()
    messages = [{"role": "user", "content": "[[unicode]]"}]
    full = client.chat.completions.create(model="m", messages=messages, logprobs=True, top_logprobs=3)
    entries = full.choices[0].logprobs.content
    assert full.usage is not None and len(entries) == full.usage.completion_tokens
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob == e.logprob for e in entries)
    eos = {demo_tokenizer.decode([i]) for i in demo_tokenizer.eos_token_ids}
    spelled = b"".join(bytes(e.bytes) for e in entries if e.token not in eos)
    assert spelled.decode() == full.choices[0].message.content == SCRIPTS["unicode"]
    streamed = [e for c in client.chat.completions.create(model="m", messages=messages, logprobs=True,
                                                          top_logprobs=3, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.bytes for e in streamed] == [e.bytes for e in entries]
    plain = client.chat.completions.create(model="m", messages=messages)
    assert plain.choices[0].logprobs is None


def test_n_choices_with_seed(scripted: ServerHarness) -> None:
    client = scripted.openai()
    full = client.chat.completions.create(model="m", messages=USER, n=2, seed=3, temperature=1.0, max_tokens=12)
    assert [c.index for c in full.choices] == [0, 1]
    assert full.choices[0].message.content != full.choices[1].message.content
    assert full.usage is not None and full.usage.completion_tokens == 24
    again = client.chat.completions.create(model="m", messages=USER, n=2, seed=3, temperature=1.0, max_tokens=12)
    assert [c.message.content for c in again.choices] == [c.message.content for c in full.choices]
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in client.chat.completions.create(model="m", messages=USER, n=2, seed=3, temperature=1.0,
                                                max_tokens=12, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1}
    assert [texts[0], texts[1]] == [c.message.content for c in full.choices]


def test_stop_strings(scripted: ServerHarness) -> None:
    client = scripted.openai()
    messages = [{"role": "user", "content": "[[stops]]"}]
    for stop in ("STOP", ["nothing", "STOP"]):
        full = client.chat.completions.create(model="m", messages=messages, stop=stop)
        assert full.choices[0].message.content == "one two three "
        assert full.choices[0].finish_reason == "stop"
        assert full.model_extra is not None
        assert full.choices[0].model_extra["stop_reason"] == "STOP"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=messages, stop="STOP", stream=True) if c.choices)
    assert streamed == "one two three "


def test_max_completion_tokens_wins(scripted: ServerHarness) -> None:
    data = raw_chat(scripted, messages=USER, max_tokens=3, max_completion_tokens=6)
    assert data["usage"]["completion_tokens"] == 6 and data["choices"][0]["finish_reason"] == "length"


def test_sampling_fields_reach_the_engine(scripted: ServerHarness) -> None:
    raw_chat(scripted, messages=USER, max_tokens=4, temperature=0.3, top_p=0.9, top_k=20, min_p=0.05,
             presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.1, seed=11, min_tokens=2,
             ignore_eos=True, stop_token_ids=[5, 6], skip_special_tokens=False, stop=["zz"])
    _, params = scripted.engine.seen[-1]
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.3, 0.9, 20, 0.05)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, 0.25, 1.1)
    assert (params.seed, params.min_tokens, params.max_tokens, params.ignore_eos) == (11, 2, 4, True)
    assert (params.stop_token_ids, params.skip_special_tokens, params.stop) == ([5, 6], False, ["zz"])
    raw_chat(scripted, messages=USER)
    assert scripted.engine.seen[-1][1].max_tokens is None  # no limit given: until the context is full


def test_prompt_is_the_rendered_template(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    """History with every role renders exactly as the template does on its own."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny.", "reasoning": "Easy."},
        {"role": "user", "content": "Thanks!"},
    ]
    raw_chat(scripted, messages=messages, max_tokens=2, chat_template_kwargs={"enable_thinking": False})
    prompt_ids, _ = scripted.engine.seen[-1]
    template = ChatTemplate.from_tokenizer(demo_tokenizer)
    assert template is not None
    expected = template.render(messages, enable_thinking=False)
    assert demo_tokenizer.decode(prompt_ids) == expected
    assert prompt_ids == demo_tokenizer.encode(expected, add_special_tokens=False)
