"""Issue 11's attacks, each against a live server (loopback, bounded sizes): the attack is
refused cleanly (400 in the protocol's shape, never 500), nothing is left queued, and
another client is unharmed (`hardening_support.assert_unharmed`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hardening_support import ORDINARY, assert_unharmed, wait_idle
from server_harness import ScriptedEngine, ServerHarness, demo_with_template

from edgemoe.server.config import ServerConfig
from edgemoe.tokenizer import TokenizerBundle

BIG = 2**70  # past 64 bits: msgspec could not even encode it for the engine
USER = [{"role": "user", "content": "hi"}]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, "max_tokens": 4, **extra}


def message(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, "max_tokens": 4, **extra}


def post(h: ServerHarness, path: str, body: Any, client: httpx.Client | None = None) -> httpx.Response:
    return (client or httpx).post(f"{h.base_url}{path}", json=body, timeout=30)  # type: ignore[attr-defined]


def error_of(r: httpx.Response) -> tuple[str, str | None]:
    """(message, param) from either protocol's error shape."""
    body = r.json()
    if body.get("type") == "error":  # Anthropic: no param, the message starts with the field
        return body["error"]["message"], None
    return body["error"]["message"], body["error"]["param"]


# --------------------------------------------------------------------------- 1. numbers


OUT_OF_RANGE = [
    ("/v1/chat/completions", chat(top_k=BIG), "top_k"),
    ("/v1/chat/completions", chat(seed=BIG), "seed"),
    ("/v1/chat/completions", chat(seed=-BIG), "seed"),
    ("/v1/chat/completions", chat(max_tokens=BIG), "max_tokens"),
    ("/v1/chat/completions", chat(max_completion_tokens=BIG), "max_completion_tokens"),
    ("/v1/chat/completions", chat(min_tokens=BIG), "min_tokens"),
    ("/v1/chat/completions", chat(n=BIG), "n"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=BIG), "top_logprobs"),
    ("/v1/chat/completions", chat(stop_token_ids=[BIG]), "stop_token_ids[0]"),
    ("/v1/chat/completions", chat(presence_penalty=BIG), "presence_penalty"),
    ("/v1/chat/completions", chat(repetition_penalty=1e300), "repetition_penalty"),
    ("/v1/chat/completions", chat(temperature=1e300), "temperature"),
    ("/v1/completions", {"model": "m", "prompt": "x", "logprobs": BIG}, "logprobs"),
    ("/v1/completions", {"model": "m", "prompt": "x", "best_of": BIG}, "best_of"),
    ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": BIG}, "max_tokens"),
    ("/v1/completions", {"model": "m", "prompt": [BIG]}, "prompt"),
    ("/v1/responses", {"model": "m", "input": "x", "max_output_tokens": BIG}, "max_output_tokens"),
    ("/v1/responses", {"model": "m", "input": "x", "top_k": BIG}, "top_k"),
    ("/v1/responses", {"model": "m", "input": "x", "seed": BIG}, "seed"),
    ("/v1/messages", message(max_tokens=BIG), "max_tokens"),
    ("/v1/messages", message(top_k=BIG), "top_k"),
    ("/v1/messages", message(thinking={"type": "enabled", "budget_tokens": BIG}), "thinking.budget_tokens"),
    ("/v1/detokenize", {"tokens": [BIG]}, "tokens"),
]


@pytest.mark.parametrize(("path", "body", "field"), OUT_OF_RANGE, ids=[f"{p}:{f}" for p, _, f in OUT_OF_RANGE])
def test_out_of_range_numbers_are_400_naming_the_field(
    scripted: ServerHarness, path: str, body: dict[str, Any], field: str
) -> None:
    r = post(scripted, path, body)
    assert r.status_code == 400, r.text
    text, param = error_of(r)
    assert text.startswith(field) or text.startswith("token ids"), text
    if param is not None:
        assert param == field
    for internal in ("literal[", "Value error", "Input should", "function-after", "OverflowError"):
        assert internal not in text


def test_an_overflow_flood_leaves_nothing_queued(scripted: ServerHarness) -> None:
    """256 requests past 2⁶⁴ once left 256 requests queued for good (every later one: 429)."""

    def flood() -> list[int]:
        with httpx.Client(timeout=30) as client:
            return [client.post(f"{scripted.base_url}/v1/chat/completions", json=chat(
                n=3, seed=BIG if i % 2 else None, top_k=None if i % 2 else BIG)).status_code for i in range(64)]

    statuses = assert_unharmed(scripted, flood)
    assert set(statuses) == {400}
    assert post(scripted, "/v1/chat/completions", ORDINARY).status_code == 200


def test_a_send_failing_midway_takes_the_whole_group_back(make_scripted: Any) -> None:
    """Any exception in the send (not only ZMQ's): no choice stays counted, mapped or running."""
    h = make_scripted()
    client, real_send = h.client, h.client._send_frame
    calls: list[int] = []

    def second_send_fails(frame: bytes) -> None:
        calls.append(len(frame))
        if len(calls) == 2:
            raise RuntimeError("the send broke")
        real_send(frame)

    client._send_frame = second_send_fails  # type: ignore[method-assign]
    try:
        r = post(h, "/v1/chat/completions", chat(n=3, messages=[{"role": "user", "content": "[[hang]]"}]))
    finally:
        client._send_frame = real_send  # type: ignore[method-assign]
    assert r.status_code == 503, r.text
    assert len(calls) >= 3  # two adds, then the abort of the one that went out
    assert not client._streams
    wait_idle(h)
    assert not h.engine.requests  # the first choice reached the engine, and was aborted there
    assert post(h, "/v1/chat/completions", ORDINARY).status_code == 200


# --------------------------------------------------------------------------- 3. stop strings


def test_stop_string_limits(scripted: ServerHarness) -> None:
    for body, field in [(chat(stop=["x"] * 65), "stop"), (chat(stop="é" * 129), "stop"),
                        (chat(stop=["ok", ""]), "stop")]:
        r = post(scripted, "/v1/chat/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = post(scripted, "/v1/messages", message(stop_sequences=["x"] * 65))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("stop_sequences may hold at most 64")
    assert "stop stop" not in r.text
    ok = post(scripted, "/v1/chat/completions", chat(stop=["y" * 256, *("x" * 200 + str(i) for i in range(63))]))
    assert ok.status_code == 200  # exactly at the limits


def test_many_long_stops_with_many_choices_do_not_stall_others(scripted: ServerHarness) -> None:
    """1.6 M stop strings × n = 4 once held the engine 29 s; now 64 × 256 bytes is the most,
    and matching costs each token the same whatever their number."""
    stops = [f"{i:03d}" + "q" * 252 for i in range(64)]  # never produced: every token is scanned
    huge = post(scripted, "/v1/chat/completions", chat(stop=[f"s{i}" for i in range(20000)]))
    assert huge.status_code == 400

    def attack() -> list[int]:
        return [post(scripted, "/v1/chat/completions", chat(n=4, max_tokens=48, stop=stops)).status_code
                for _ in range(3)]

    assert assert_unharmed(scripted, attack) == [200, 200, 200]


# --------------------------------------------------------------------------- 4. tool schemas


def _schema_bomb() -> dict[str, Any]:
    # Each level refers to the next three times: 3^40 expansions without memoising, and a
    # self-referring one that branches forever within the old depth cap.
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 3} for i in range(40)}
    defs["d40"] = {"type": "integer"}
    defs["loop"] = {"allOf": [{"$ref": "#/$defs/loop"}] * 3}
    return {"type": "object", "$defs": defs,
            "properties": {"p": {"$ref": "#/$defs/d0"}, "q": {"$ref": "#/$defs/loop"}}}


@pytest.fixture(scope="module")
def coder(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    call = "<tool_call>\n<function=f>\n<parameter=p>\n5\n</parameter>\n<parameter=q>\n7\n</parameter>\n</function>\n</tool_call>"
    engine = ScriptedEngine(demo_tokenizer, {"bomb": call})
    harness = ServerHarness(engine, engine.ready(demo_dir), ServerConfig(tool_call_parser="qwen3_coder")).start()
    yield harness
    harness.stop()


def test_a_tool_schema_bomb_is_resolved_in_bounded_work(coder: ServerHarness) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": _schema_bomb()}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "[[bomb]]"}], "tools": tools}

    def attack() -> dict[str, Any]:
        return post(coder, "/v1/chat/completions", body).json()

    reply = assert_unharmed(coder, attack)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {"p": 5, "q": 7}  # p typed through 40 levels of $ref


# --------------------------------------------------------------------------- 5. big bodies


def test_a_big_prompt_is_refused_without_tokenising_it_all(scripted: ServerHarness) -> None:
    big = "word " * 1_200_000  # 6 MB; the context is 4096 tokens

    def attack() -> list[httpx.Response]:
        return [post(scripted, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": big}]}),
                post(scripted, "/v1/completions", {"model": "m", "prompt": big}),
                post(scripted, "/v1/tokenize", {"model": "m", "prompt": big}),
                post(scripted, "/v1/detokenize", {"model": "m", "tokens": [1] * 5000})]

    chat_r, completion_r, tokenize_r, detokenize_r = assert_unharmed(scripted, attack)
    for r in (chat_r, completion_r, tokenize_r):
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert "4096" in r.json()["error"]["message"]
    assert detokenize_r.status_code == 400 and detokenize_r.json()["error"]["param"] == "tokens"


def test_a_body_of_many_messages_is_parsed_off_the_event_loop(scripted: ServerHarness) -> None:
    """3.6 MB of tiny messages: seconds of parsing and validation, once all on the event loop.
    The last message is invalid, so the whole body is parsed and validated, then refused."""
    many = [{"role": "user", "content": "x"}] * 120_000 + [{"role": "wizard", "content": "x"}]
    # Encoded here: the client shares this process (and its GIL) with the server under test.
    body = json.dumps({"model": "m", "messages": many}).encode()

    def attack() -> httpx.Response:
        return httpx.post(f"{scripted.base_url}/v1/chat/completions", content=body, timeout=30,
                          headers={"content-type": "application/json"})

    r = assert_unharmed(scripted, attack)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[120000].role", r.text


def test_count_tokens_counts_a_long_prompt_exactly(scripted: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    text = "alpha beta\ngamma delta " * 30_000  # ~690 K characters: three tokeniser pieces, past the context
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    counted = post(scripted, "/v1/messages/count_tokens", body).json()["input_tokens"]
    state = scripted.app.state.edgemoe
    rendered = state.model.template.render([{"role": "user", "content": text}], add_generation_prompt=True,
                                           enable_thinking=True)
    assert counted == len(demo_tokenizer.encode(rendered, add_special_tokens=False))  # one whole-text encode


# --------------------------------------------------------------------------- 7. templates


HOSTILE_TEMPLATE = """\
{%- if spin is defined %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}
{%- if big is defined %}{{ 'a' * 2000000000 }}{% endif %}
{%- if deep is defined %}{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}{% endif %}
{%- if fail is defined %}{{ raise_exception('the template refuses') }}{% endif %}
[{{ bos_token }}]{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}<|im_start|>assistant
"""


@pytest.fixture(scope="module")
def hostile(demo_dir: Path, demo_tokenizer: TokenizerBundle, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[ServerHarness]:
    model_dir = demo_with_template(demo_dir, tmp_path_factory.mktemp("hostile"), HOSTILE_TEMPLATE)
    engine = ScriptedEngine(demo_tokenizer)
    harness = ServerHarness(engine, engine.ready(model_dir), ServerConfig(template_timeout=0.5)).start()
    yield harness
    harness.stop()


@pytest.mark.parametrize(("kwarg", "expected"), [
    ("spin", "longer than 0.5 s"), ("big", "characters; the limit is"), ("deep", "recursion"),
    ("fail", "the template refuses"),
])
def test_template_renders_are_bounded(hostile: ServerHarness, kwarg: str, expected: str) -> None:
    def attack() -> httpx.Response:
        return post(hostile, "/v1/chat/completions", chat(chat_template_kwargs={kwarg: True}))

    r = assert_unharmed(hostile, attack, probes=1)
    assert r.status_code == 400 and expected in r.json()["error"]["message"], r.text


def test_template_kwargs_cannot_replace_reserved_variables(hostile: ServerHarness,
                                                           demo_tokenizer: TokenizerBundle) -> None:
    kwargs = {"bos_token": "EVIL", "raise_exception": "EVIL", "messages": [], "add_generation_prompt": False,
              "fail": True}
    r = post(hostile, "/v1/chat/completions", chat(chat_template_kwargs=kwargs))
    assert r.status_code == 400 and "the template refuses" in r.text  # the real raise_exception ran
    del kwargs["fail"]
    ids = post(hostile, "/v1/tokenize", {"model": "m", "messages": USER, "chat_template_kwargs": kwargs}).json()
    text = demo_tokenizer.decode(ids["tokens"])
    assert "EVIL" not in text and "<|im_start|>user\nhi" in text and text.endswith("<|im_start|>assistant")


# --------------------------------------------------------------------------- 10. Unicode, errors, connections

SURROGATE_BODIES = [
    ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages[0].content"),
    ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\udc00"]}',
     "stop[0]"),
    ("/v1/chat/completions", '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    ("/v1/chat/completions",
     '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"\\ud800": 1}}',
     "chat_template_kwargs.\\ud800"),
    ("/v1/completions", '{"model": "m", "prompt": "\\ud83d"}', "prompt"),
    ("/v1/responses", '{"model": "m", "input": "\\ud800"}', "input"),
    ("/v1/messages", '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}', None),
    ("/v1/messages/count_tokens", '{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', None),
    ("/v1/tokenize", '{"model": "m", "prompt": "\\ud800"}', "prompt"),
]


def test_invalid_unicode_is_400_everywhere_and_the_connection_lives_on(scripted: ServerHarness) -> None:
    with httpx.Client(base_url=scripted.base_url, timeout=30) as client:
        for path, body, param in SURROGATE_BODIES:
            r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
            text, got = error_of(r)
            assert "invalid Unicode" in text
            if param is not None:
                assert got == param
            assert r.headers.get("connection") != "close"
            assert client.get("/health").status_code == 200  # same connection, still usable
        paired = client.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "\U0001F600"}]))
        assert paired.status_code == 200  # a surrogate pair is a character
    wait_idle(scripted)


def _call_with_arguments(arguments: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                                                  "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "a", "content": "x"}]


@pytest.mark.parametrize("arguments", ['{"a": "\\ud800"}', '{"\\udc00x": 1}', '{"a": ["ok", {"b": "\\udfff"}]}'])
def test_a_surrogate_inside_tool_call_arguments_is_400_on_every_route(scripted: ServerHarness, arguments: str) -> None:
    """The body holds `\\ud800` as text inside the arguments string, which is valid JSON and
    valid Unicode; decoding the arguments' own JSON makes the lone surrogate (was a 500)."""
    messages = _call_with_arguments(arguments)
    item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": arguments}
    requests = [("/v1/chat/completions", chat(messages=messages)),
                ("/v1/chat/completions", chat(messages=messages, stream=True)),
                ("/v1/tokenize", {"model": "m", "messages": messages}),
                ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": "hi"}, item,
                                                           {"type": "function_call_output", "call_id": "c",
                                                            "output": "x"}]})]
    with httpx.Client(base_url=scripted.base_url, timeout=30) as client:
        for path, body in requests:
            r = client.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            assert "invalid Unicode" in error_of(r)[0], (path, r.text)
        assert client.post("/v1/chat/completions", json=chat(messages=_call_with_arguments('{"a": "\\u00e9"}'))
                           ).status_code == 200  # an escaped character that is one decodes as before
    wait_idle(scripted)


def test_an_unexpected_failure_is_a_clean_500_and_the_connection_lives_on(
    scripted: ServerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgemoe.server.openai_chat as openai_chat

    def broken(*args: Any) -> Any:
        raise RuntimeError("internal detail 4f2a")

    monkeypatch.setattr(openai_chat, "_completion_body", broken)
    with httpx.Client(base_url=scripted.base_url, timeout=30) as client:
        r = client.post("/v1/chat/completions", json=chat())
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "4f2a" not in r.text and "RuntimeError" not in r.text
        assert client.get("/health").status_code == 200  # no ECONNRESET on the kept-alive connection
    wait_idle(scripted)


@pytest.mark.parametrize(("body", "expected"), [
    (chat(tool_choice="bogus"), ("tool_choice", "tool_choice must be 'none', 'auto', 'required' or an object")),
    (chat(tool_choice={"type": "function"}), ("tool_choice.function", "tool_choice.function is required")),
    (chat(messages=[{"role": "user", "content": 5}]),
     ("messages[0].content", "messages[0].content must be a string or an array")),
    (chat(messages=[{"role": "wizard", "content": "x"}]),
     ("messages[0].role", "messages[0].role must be 'system', 'developer', 'user', 'assistant' or 'tool'")),
    (chat(stop=["ok", ""]), ("stop", "stop may not contain an empty string")),
    (chat(temperature=-1), ("temperature", "temperature must be between 0 and 100 (got -1.0)")),
    (chat(tools=[{"type": "function"}]), ("tools[0]", "tools[0]: a function tool needs a 'function' object")),
    ({"model": "m"}, ("messages", "messages is required")),
])
def test_error_messages_are_written_for_the_client(scripted: ServerHarness, body: dict[str, Any],
                                                    expected: tuple[str, str]) -> None:
    r = post(scripted, "/v1/chat/completions", body)
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["message"]) == expected


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", chat(max_tokens="4"), "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=True), "max_tokens"),
    ("/v1/chat/completions", chat(max_tokens=4.0), "max_tokens"),
    ("/v1/chat/completions", chat(seed="1"), "seed"),
    ("/v1/chat/completions", chat(stream="yes"), "stream"),
    ("/v1/chat/completions", chat(logprobs="yes"), "logprobs"),
    ("/v1/chat/completions", chat(temperature="0.5"), "temperature"),
    ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": "4"}, "max_tokens"),
    ("/v1/responses", {"model": "m", "input": "x", "max_output_tokens": "4"}, "max_output_tokens"),
    ("/v1/messages", {"model": "m", "max_tokens": "4", "messages": [{"role": "user", "content": "x"}]}, None),
])
def test_values_of_the_wrong_json_type_are_400_not_coerced(scripted: ServerHarness, path: str,
                                                           body: dict[str, Any], param: str | None) -> None:
    """A string, a boolean or a float where the API takes an integer (or a string where it takes a
    number or a boolean) is refused as the OpenAI and Anthropic APIs refuse it, never read as
    the value it might mean; an integer where a number goes stays fine (below)."""
    r = post(scripted, path, body)
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param
    assert post(scripted, "/v1/chat/completions", chat(temperature=1, top_p=1, max_tokens=2)).status_code == 200


# --------------------------------------------------------------------------- logging


def access_lines(caplog: pytest.LogCaptureFixture, count: int) -> list[str]:
    """The access lines once `count` are there: a line is written when the server's side of
    the response is over, which can be just after the client has read the last byte."""
    deadline = time.monotonic() + 10
    while True:
        lines = [r.getMessage() for r in caplog.records if r.name == "edgemoe.access"]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_access_log_line_per_request_without_text(scripted: ServerHarness, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="edgemoe.access"):
        post(scripted, "/v1/chat/completions", chat(n=2, messages=[{"role": "user", "content": "zebra-7781"}]))
        post(scripted, "/v1/chat/completions", chat(temperature=-1))
        lines = access_lines(caplog, count=2)
    ok = next(line for line in lines if '"POST /v1/chat/completions" 200' in line)
    assert " in=" in ok and " out=8 " in ok and ok.endswith("s")  # two choices of 4 tokens
    assert any('"POST /v1/chat/completions" 400' in line for line in lines)
    assert not any("zebra" in line for line in lines)


def test_quiet_logs_no_access_lines(make_scripted: Any, caplog: pytest.LogCaptureFixture) -> None:
    # NOTE: the module's other server may still write a line of an earlier test's request
    # here (a line is written when the server's side of a response is over), so the quiet
    # server's requests go to a path no other test asks for and only lines naming it count.
    h = make_scripted(quiet=True)
    with caplog.at_level(logging.INFO, logger="edgemoe.access"):
        assert post(h, "/v1/chat/completions/quiet-7781", chat()).status_code == 404
        assert post(h, "/v1/chat/completions", chat()).status_code == 200
        time.sleep(0.2)  # past when a line would have been written
    assert not [r for r in caplog.records if r.name == "edgemoe.access" and "quiet-7781" in r.getMessage()]
