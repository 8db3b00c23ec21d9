"""The scripted agent backend of `make agents-smoke`: its decisions on real rendered prompts,
and the text it streams back through the real detokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgemoe.messages import SamplingParams
from edgemoe.server.parsers import get_tool_parser
from edgemoe.server.templates import ChatTemplate
from edgemoe.testing import QWEN3_CHAT_TEMPLATE, demo_model_path
from edgemoe.messages import RequestOutput
from edgemoe.testing.agent_backend import (
    AgentScriptEngine,
    build_agent_backend,
    cut_file,
    expected_output,
    reasoning_text,
    second_output,
)
from edgemoe.tokenizer import TokenizerBundle

TEMPLATE = ChatTemplate(QWEN3_CHAT_TEMPLATE)


def tool(name: str, **props: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


@pytest.fixture(scope="module")
def tokenizer() -> TokenizerBundle:
    return TokenizerBundle.load(demo_model_path())


def run(engine: AgentScriptEngine, prompt: str, tokenizer: TokenizerBundle, **params: Any) -> str:
    engine.add_request(tokenizer.encode(prompt, add_special_tokens=False), SamplingParams(**params), "r")
    text = ""
    while engine.has_work():
        for out in engine.step():
            text += out.text
    return text


@pytest.mark.parametrize(("tools", "arguments"), [
    ([tool("Read", file_path={"type": "string"}), tool("Bash", command={"type": "string"}, description={"type": "string"})],
     {"name": "Bash", "arguments": {"command": "echo edgemoe-smoke-$((6*7))-m1", "description": "Print the smoke-test marker"}}),
    ([tool("exec_command", cmd={"type": "string"})],
     {"name": "exec_command", "arguments": {"cmd": "echo edgemoe-smoke-$((6*7))-m1"}}),
    ([tool("shell", command={"type": "array", "items": {"type": "string"}})],
     {"name": "shell", "arguments": {"command": ["bash", "-lc", "echo edgemoe-smoke-$((6*7))-m1"]}}),
])
def test_first_turn_calls_the_shell_tool(tmp_path: Path, tokenizer: TokenizerBundle, tools: list[dict[str, Any]],
                                         arguments: dict[str, Any]) -> None:
    engine = AgentScriptEngine(tokenizer, "m1", tmp_path / "rec.jsonl")
    prompt = TEMPLATE.render([{"role": "user", "content": "go"}], tools=tools)
    text = run(engine, prompt, tokenizer)
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    assert json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")) == arguments
    (record,) = [json.loads(line) for line in (tmp_path / "rec.jsonl").read_text().splitlines()]
    assert record["decision"] == "tool_call" and record["prompt"] == prompt


def test_answers_once_the_tool_result_is_back(tmp_path: Path, tokenizer: TokenizerBundle) -> None:
    engine = AgentScriptEngine(tokenizer, "m2", tmp_path / "rec.jsonl")
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go, and expect edgemoe-smoke-42-m2"},  # the user's text does not count
    ]
    tools = [tool("bash", command={"type": "string"})]
    assert run(engine, TEMPLATE.render(messages, tools=tools), tokenizer).startswith("<tool_call>")
    messages += [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "bash", "arguments": {}}}]},
                 {"role": "tool", "content": f"{expected_output('m2')}\n"}]
    assert run(engine, TEMPLATE.render(messages, tools=tools), tokenizer) == f"The command printed {expected_output('m2')}."
    assert run(engine, TEMPLATE.render([{"role": "user", "content": "title?"}]), tokenizer) == "OK."
    assert run(engine, TEMPLATE.render(messages, tools=tools), tokenizer, max_tokens=2) == "The command"


def outputs(engine: AgentScriptEngine, prompt: str, tokenizer: TokenizerBundle) -> list[RequestOutput]:
    engine.add_request(tokenizer.encode(prompt, add_special_tokens=False), SamplingParams(max_tokens=4096), "r")
    done: list[RequestOutput] = []
    while engine.has_work():
        done += engine.step()
    return done


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "array", "items": {"type": "string"}}])
def test_cut_call_ends_by_length_inside_the_command(tmp_path: Path, tokenizer: TokenizerBundle,
                                                    schema: dict[str, Any]) -> None:
    engine = AgentScriptEngine(tokenizer, "m3", tmp_path / "rec.jsonl", cut_calls=1)
    prompt = TEMPLATE.render([{"role": "user", "content": "go"}],
                             tools=[tool("Bash", command=schema, description={"type": "string"})])
    cut = outputs(engine, prompt, tokenizer)
    text = "".join(o.text for o in cut)
    assert cut[-1].finished and cut[-1].finish_reason == "length"  # a length limit, no EOS
    assert text.startswith('<tool_call>\n{"name": "Bash", "arguments": {"command": ')
    assert text.endswith(f'"touch {cut_file("m3")}; ec')  # inside the command's string value
    # What the server makes of it: the call, named, with no argument completed.
    parser = get_tool_parser("hermes")([])
    calls = [*parser.feed(text).tool_calls, *parser.finish().tool_calls]
    assert [c.name for c in calls if c.name] == ["Bash"] and json.loads("".join(c.arguments for c in calls)) == {}
    # The cut is used up: the same prompt now gets the whole call, then the answer as ever.
    assert run(engine, prompt, tokenizer).endswith("}}\n</tool_call>")
    decisions = [json.loads(line)["decision"] for line in (tmp_path / "rec.jsonl").read_text().splitlines()]
    assert decisions == ["cut_call", "tool_call"]


def test_cut_calls_counts_only_shell_calls(tmp_path: Path, tokenizer: TokenizerBundle) -> None:
    engine = AgentScriptEngine(tokenizer, "m4", tmp_path / "rec.jsonl", cut_calls=2)
    shell = TEMPLATE.render([{"role": "user", "content": "go"}], tools=[tool("bash", command={"type": "string"})])
    assert run(engine, TEMPLATE.render([{"role": "user", "content": "title?"}]), tokenizer) == "OK."
    assert outputs(engine, shell, tokenizer)[-1].finish_reason == "length"
    assert outputs(engine, shell, tokenizer)[-1].finish_reason == "length"
    assert outputs(engine, shell, tokenizer)[-1].finish_reason == "stop"
    records = [json.loads(line) for line in (tmp_path / "rec.jsonl").read_text().splitlines()]
    assert [r["decision"] for r in records] == ["plain", "cut_call", "cut_call", "tool_call"]
    assert [r["max_tokens"] for r in records] == [256, 4096, 4096, 4096]  # shows an agent raising it to retry


def calls_of(text: str) -> list[dict[str, Any]]:
    """The calls the server's Hermes parser reads from `text`, arguments parsed."""
    parser = get_tool_parser("hermes")([])
    deltas = [*parser.feed(text).tool_calls, *parser.finish().tool_calls]
    calls: list[dict[str, Any]] = []
    for d in deltas:
        if d.name:
            calls.append({"name": d.name, "arguments": ""})
        calls[-1]["arguments"] += d.arguments
    return [{**c, "arguments": json.loads(c["arguments"])} for c in calls]


def test_parallel_calls_two_then_the_missing_one_then_the_answer(tmp_path: Path, tokenizer: TokenizerBundle) -> None:
    engine = AgentScriptEngine(tokenizer, "m5", tmp_path / "rec.jsonl", parallel=True)
    tools = [tool("bash", command={"type": "string"})]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    calls = calls_of(run(engine, TEMPLATE.render(messages, tools=tools), tokenizer))
    assert [c["arguments"]["command"] for c in calls] == ["echo edgemoe-smoke-$((6*7))-m5",
                                                           "echo edgemoe-smoke-$((6*9))-m5"]
    # An agent returning one result per turn is asked for the other alone.
    one = messages + [{"role": "assistant", "content": "", "tool_calls": [{"function": calls[0]}]},
                      {"role": "tool", "content": expected_output("m5")}]
    (again,) = calls_of(run(engine, TEMPLATE.render(one, tools=tools), tokenizer))
    assert again["arguments"]["command"] == "echo edgemoe-smoke-$((6*9))-m5"
    both = one + [{"role": "tool", "content": second_output("m5")}]
    assert run(engine, TEMPLATE.render(both, tools=tools), tokenizer) == (
        f"The commands printed {expected_output('m5')} and {second_output('m5')}.")
    decisions = [json.loads(line)["decision"] for line in (tmp_path / "rec.jsonl").read_text().splitlines()]
    assert decisions == ["parallel_calls", "missing_call", "answer"]


def test_thinking_opens_the_call_and_the_answer(tmp_path: Path, tokenizer: TokenizerBundle) -> None:
    engine = AgentScriptEngine(tokenizer, "m6", tmp_path / "rec.jsonl", thinking=True)
    tools = [tool("bash", command={"type": "string"})]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    think = f"<think>\n{reasoning_text('tool_call', 'm6')}\n</think>\n\n"
    text = run(engine, TEMPLATE.render(messages, tools=tools), tokenizer)
    assert text.startswith(think + "<tool_call>\n") and reasoning_text("tool_call", "m6").startswith(
        "edgemoe-think-tool_call-m6")
    messages += [{"role": "assistant", "content": "", "reasoning_content": reasoning_text("tool_call", "m6"),
                  "tool_calls": [{"function": {"name": "bash", "arguments": {}}}]},
                 {"role": "tool", "content": expected_output("m6")}]
    assert run(engine, TEMPLATE.render(messages, tools=tools), tokenizer) == (
        f"<think>\n{reasoning_text('answer', 'm6')}\n</think>\n\nThe command printed {expected_output('m6')}.")
    # Thinking off (the template wrote the empty block) or a background request: no reasoning.
    off = run(engine, TEMPLATE.render(messages[:1], tools=tools, enable_thinking=False), tokenizer)
    assert off.startswith("<tool_call>\n")
    assert run(engine, TEMPLATE.render([{"role": "user", "content": "title?"}]), tokenizer) == "OK."
    records = [json.loads(line) for line in (tmp_path / "rec.jsonl").read_text().splitlines()]
    assert [(r["decision"], r["thinks"]) for r in records] == [("tool_call", True), ("answer", True),
                                                               ("tool_call", False), ("plain", False)]


def test_build_from_spec(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"marker": "abc", "record": str(tmp_path / "r.jsonl")}))
    engine, ready = build_agent_backend({}, str(spec))
    assert engine.marker == "abc" and ready.model_type == "qwen3_moe" and ready.max_model_len >= 131072
    assert engine.cuts_left == 0
    spec.write_text(json.dumps({"marker": "abc", "record": str(tmp_path / "r.jsonl"), "cut_call": True}))
    assert build_agent_backend({}, str(spec))[0].cuts_left == 1
    assert not engine.parallel and not engine.thinking
    spec.write_text(json.dumps({"marker": "abc", "record": str(tmp_path / "r.jsonl"), "parallel": True,
                                "thinking": True}))
    engine = build_agent_backend({}, str(spec))[0]
    assert engine.parallel and engine.thinking


def test_engine_process_builds_it_from_the_factory_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgemoe.engine.service import ENGINE_FACTORY_ENV, build_engine
    from edgemoe.testing.agent_backend import FACTORY, SPEC_ENV

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"marker": "hook", "record": str(tmp_path / "r.jsonl")}))
    monkeypatch.setenv(ENGINE_FACTORY_ENV, FACTORY)
    monkeypatch.setenv(SPEC_ENV, str(spec))
    engine, _ = build_engine({})
    assert isinstance(engine, AgentScriptEngine) and engine.marker == "hook"
    monkeypatch.setenv(ENGINE_FACTORY_ENV, "edgemoe.testing.agent_backend:no_such_function")
    with pytest.raises(ValueError, match="cannot import"):
        build_engine({})
