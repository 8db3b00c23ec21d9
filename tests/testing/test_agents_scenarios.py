"""`scripts/agents_scenarios.py`: how the parallel-calls and thinking runs of `make agents-smoke`'s
script are judged, on made-up runs (the real CLIs run only under scripts/agents_smoke.py)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from script_module import load_script

from edgemoe.testing.agent_backend import command, expected_output, reasoning_text, second_command, second_output

OK_LOG = 'edgemoe: 127.0.0.1:1 "POST /v1/messages" 200 in=10 cached=0 out=5 0.05s\n'
BAD_LOG = OK_LOG + 'edgemoe: 127.0.0.1:1 "POST /v1/messages" 400 0.01s\n'


@pytest.fixture(scope="module")
def sc() -> ModuleType:
    return load_script("agents_scenarios")


def prompt(decision: str, history: str = "", *results: str, thinks: bool = False, output: str = "") -> dict[str, Any]:
    blocks = "".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return {"decision": decision, "prompt": f"<tools>\n</tools>{history}{blocks}", "thinks": thinks, "output": output}


def both_calls(think: str = "") -> str:
    calls = "\n".join(f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{c}"}}}}\n</tool_call>'
                      for c in (command("mk"), second_command("mk")))
    return f"<|im_start|>assistant\n{think}{calls}<|im_end|>\n"


ANSWER = f"The commands printed {expected_output('mk')} and {second_output('mk')}."


def test_server_errors_are_the_4xx_5xx_lines(sc: ModuleType) -> None:
    assert sc.server_errors(OK_LOG) == []
    assert sc.server_errors(BAD_LOG + "Traceback (most recent call last):\n") == ["POST /v1/messages 400",
                                                                                  "server traceback"]


def test_parallel_results_in_one_turn_pass(sc: ModuleType) -> None:
    prompts = [prompt("parallel_calls"),
               prompt("answer", both_calls(), expected_output("mk"), second_output("mk"))]
    problems, detail = sc.parallel_verdict(prompts, ANSWER, "", 0, "mk", OK_LOG)
    assert problems == [] and "results per request [2] (one turn)" in detail
    assert "both calls in one assistant turn of the history: True" in detail


def test_parallel_results_over_two_turns_pass_and_say_so(sc: ModuleType) -> None:
    prompts = [prompt("parallel_calls"), prompt("missing_call", "", expected_output("mk")),
               prompt("answer", "", expected_output("mk"), second_output("mk"))]
    problems, detail = sc.parallel_verdict(prompts, ANSWER, "", 0, "mk", OK_LOG)
    assert problems == [] and "results per request [1, 1] (over several turns)" in detail


def test_parallel_fails_on_a_rejected_request_or_a_missing_answer(sc: ModuleType) -> None:
    prompts = [prompt("parallel_calls")]
    problems, _ = sc.parallel_verdict(prompts, f"The command printed {expected_output('mk')}.", "", 1, "mk", BAD_LOG)
    assert problems == ["exit 1", "server answered POST /v1/messages 400",
                        "the model never answered (no tool result came back)",
                        "the answer quoting both outputs was not printed"]


def thinking_run(history: str) -> list[dict[str, Any]]:
    think = f"<think>\n{reasoning_text('tool_call', 'mk')}\n</think>\n\n"
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "x"}}\n</tool_call>'
    return [prompt("tool_call", thinks=True, output=think + call),
            prompt("answer", history.format(think=think, call=call), expected_output("mk"), thinks=True)]


@pytest.mark.parametrize(("history", "echo", "verbatim"), [
    ("<|im_start|>assistant\n{think}{call}<|im_end|>\n", "kept", True),
    ("<|im_start|>assistant\n{call}<|im_end|>\n", "dropped", False),
    ("<|im_start|>user\n{think}<|im_end|>\n", "elsewhere", False),
])
def test_reasoning_echo(sc: ModuleType, history: str, echo: str, verbatim: bool) -> None:
    prompts = thinking_run(history)
    assert sc.reasoning_echo(prompts, "mk") == echo and sc.history_verbatim(prompts) is verbatim


def test_thinking_run_passes_when_the_reasoning_is_kept(sc: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sc.EXPECTED_REASONING_ECHO, "claude", "kept")
    prompts = thinking_run("<|im_start|>assistant\n{think}{call}<|im_end|>\n")
    problems, detail = sc.thinking_verdict("claude", prompts, f"The command printed {expected_output('mk')}.", "",
                                           0, "mk", OK_LOG)
    assert problems == [] and "reasoning sent back: kept, call turn re-rendered verbatim: True" in detail


def test_thinking_run_fails_on_leaks_rejections_and_a_changed_echo(sc: ModuleType,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sc.EXPECTED_REASONING_ECHO, "opencode", "kept")
    prompts = thinking_run("<|im_start|>assistant\n{call}<|im_end|>\n")
    out = f"<think>\nhmm\n</think>\nThe command printed {expected_output('mk')}."
    problems, _ = sc.thinking_verdict("opencode", prompts, out, "", 0, "mk", BAD_LOG)
    assert problems == ["server answered POST /v1/messages 400", "a raw <think> tag reached the agent's output",
                        "reasoning dropped, expected kept"]


def test_thinking_off_is_a_failure(sc: ModuleType) -> None:
    prompts = [prompt("tool_call"), prompt("answer", "", expected_output("mk"))]
    problems, _ = sc.thinking_verdict("codex", prompts, f"The command printed {expected_output('mk')}.", "", 0, "mk",
                                      OK_LOG)
    assert "the shell call came without thinking (thinking off?)" in problems


def test_smoke_script_uses_this_module() -> None:
    smoke = load_script("agents_smoke")
    assert smoke.backend_spec("mk", Path("r.jsonl"), scenario="parallel-calls") == {
        "marker": "mk", "record": "r.jsonl", "parallel": True}
    assert smoke.backend_spec("mk", Path("r.jsonl"), scenario="thinking")["thinking"] is True
    assert smoke.backend_spec("mk", Path("r.jsonl"), 1, "cut-call") == {"marker": "mk", "record": "r.jsonl",
                                                                         "cut_call": 1}
    assert {"parallel-calls", "thinking"} <= set(smoke.SCENARIOS)
