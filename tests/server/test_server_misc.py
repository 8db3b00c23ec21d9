"""Models, tokenize/detokenize, legacy completions and health, over the scripted engine."""

from __future__ import annotations

from typing import Any

import httpx
from openai.types import Completion, Model
from server_harness import ServerHarness
from server_scripts import SCRIPTS, WEATHER_TOOL

from edgemoe.server.templates import ChatTemplate
from edgemoe.tokenizer import TokenizerBundle


def test_health_and_debug(scripted: ServerHarness, demo_dir: Any) -> None:
    r = httpx.get(f"{scripted.base_url}/health")
    assert r.status_code == 200 and set(r.json()) == {"status", "model", "uptime"}
    assert r.json()["status"] == "ok" and r.json()["model"] == demo_dir.name and r.json()["uptime"] > 0
    head = httpx.head(f"{scripted.base_url}/health")  # what uptime probes and load balancers send
    assert head.status_code == 200 and head.content == b""
    info = httpx.get(f"{scripted.base_url}/debug/engine").json()
    assert info["state"] == "ready" and info["model_dir"] == str(demo_dir)
    assert info["served_model_name"] == demo_dir.name and info["tool_call_parser"] == "hermes"


def test_models(scripted: ServerHarness, demo_dir: Any) -> None:
    client = scripted.openai()
    (card,) = client.models.list().data
    assert card.id == demo_dir.name and card.object == "model"
    assert client.models.retrieve("any-name-at-all").id == "any-name-at-all"
    for path in ("/v1/models", "/v1/models/", "/v1/models/org/name", "/v1/models/org/name/"):
        r = httpx.get(f"{scripted.base_url}{path}")
        assert r.status_code == 200, path
        body = r.json()
        for item in body["data"] if "data" in body else [body]:
            Model.model_validate(item, strict=True)
            assert item["max_model_len"] == 4096
    assert httpx.get(f"{scripted.base_url}/v1/models/org/name/").json()["id"] == "org/name"


def test_tokenize_detokenize_round_trip(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    text = "Hello, naïve wörld — 你好!"
    r = httpx.post(f"{scripted.base_url}/v1/tokenize", json={"model": "m", "prompt": text}).json()
    assert r["tokens"] == demo_tokenizer.encode(text) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 4096
    back = httpx.post(f"{scripted.base_url}/v1/detokenize/", json={"model": "m", "tokens": r["tokens"]}).json()
    assert back == {"prompt": text}


def test_tokenize_messages_matches_the_chat_prompt(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    r = httpx.post(f"{scripted.base_url}/v1/tokenize",
                   json={"model": "m", "messages": messages, "tools": [WEATHER_TOOL]}).json()
    template = ChatTemplate.from_tokenizer(demo_tokenizer)
    assert template is not None
    expected = template.render(messages, tools=[WEATHER_TOOL], enable_thinking=True)
    assert r["tokens"] == demo_tokenizer.encode(expected, add_special_tokens=False)
    httpx.post(f"{scripted.base_url}/v1/chat/completions",
               json={"model": "m", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 1})
    assert scripted.engine.seen[-1][0] == r["tokens"]  # what chat sends the engine


def test_tokenize_errors(scripted: ServerHarness) -> None:
    for body in ({"model": "m"}, {"model": "m", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}):
        assert httpx.post(f"{scripted.base_url}/v1/tokenize", json=body).status_code == 400
    r = httpx.post(f"{scripted.base_url}/v1/detokenize", json={"model": "m", "tokens": [-1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_completions(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = scripted.openai()
    full = client.completions.create(model="m", prompt="Once upon a time", max_tokens=10, seed=5, temperature=1.0)
    Completion.model_validate(full.model_dump(exclude_unset=True), strict=True)
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    assert full.usage is not None and full.usage.completion_tokens == 10
    assert full.usage.prompt_tokens == len(demo_tokenizer.encode("Once upon a time"))
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=10, seed=5, temperature=1.0, stream=True) if c.choices)
    assert streamed == full.choices[0].text
    assert scripted.engine.seen[-1][0] == demo_tokenizer.encode("Once upon a time")


def test_completions_token_prompt_echo_stop_n(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    client = scripted.openai()
    ids = demo_tokenizer.encode("[[stops]]")
    stopped = client.completions.create(model="m", prompt=ids, stop=["STOP"])
    assert stopped.choices[0].text == "one two three " and stopped.choices[0].finish_reason == "stop"
    assert scripted.engine.seen[-1][0] == ids
    echoed = client.completions.create(model="m", prompt="[[stops]]", stop="STOP", echo=True)
    assert echoed.choices[0].text == "[[stops]]one two three "
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt="[[stops]]", stop="STOP", echo=True, stream=True) if c.choices)
    assert streamed == echoed.choices[0].text
    two = client.completions.create(model="m", prompt=[ids], n=2, max_tokens=3)
    assert [c.index for c in two.choices] == [0, 1]


def test_completions_logprobs_and_usage_chunk(scripted: ServerHarness) -> None:
    client = scripted.openai()
    full = client.completions.create(model="m", prompt="[[unicode]]", logprobs=2)
    lp = full.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == len(lp.token_logprobs or []) == len(lp.top_logprobs or [])
    assert all(len(top) <= 2 for top in lp.top_logprobs or [])
    assert full.choices[0].text == SCRIPTS["unicode"]
    chunks = list(client.completions.create(model="m", prompt="x", max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
