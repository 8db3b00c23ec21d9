"""`scripts/agents_smoke.py --scenario cut-call`: how a run is judged, on made-up runs (the real
CLIs run only under `make agents-smoke`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from script_module import load_script

from edgemoe.testing.agent_backend import cut_file, expected_output


@pytest.fixture(scope="module")
def smoke() -> ModuleType:
    return load_script("agents_smoke")


@pytest.fixture(scope="module")
def sc() -> ModuleType:
    return load_script("agents_scenarios")


class FakeServer:
    def __init__(self, prompts: list[dict[str, Any]]) -> None:
        self._prompts = prompts

    def prompts(self) -> list[dict[str, Any]]:
        return self._prompts


def make_run(tmp_path: Path, smoke: ModuleType, out: str, err: str = "", cuts: int = 1) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "work").mkdir(parents=True)
    (run_dir / "agent.out").write_text(out)
    (run_dir / "agent.err").write_text(err)
    (run_dir / "backend.json").write_text(json.dumps(smoke.backend_spec("mk", run_dir / "prompts.jsonl", cuts)))
    return run_dir


@pytest.fixture(autouse=True)
def root(tmp_path: Path, smoke: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke, "ROOT", tmp_path)  # the detail names the logs relative to it


def prompt(decision: str, *results: str) -> dict[str, Any]:
    blocks = "".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return {"decision": decision, "prompt": f"<tools>\n</tools>{blocks}", "max_tokens": 32000}


RECOVERED = [prompt("cut_call"), prompt("tool_call", "Error: command is missing"),
             prompt("answer", "Error: command is missing", expected_output("mk"))]


def test_tool_results_are_listed_once_in_order(sc: ModuleType) -> None:
    assert sc.tool_results(RECOVERED) == ["Error: command is missing", expected_output("mk")]


@pytest.mark.parametrize(("code", "decisions", "printed", "output", "outcome"), [
    (0, ["cut_call", "tool_call", "answer"], True, "", "recovers"),
    (1, ["cut_call"], False, "ERROR: Incomplete response returned, reason: max_output_tokens", "reports"),
    (1, ["cut_call"], False, "something went wrong", "other"),  # an error that does not say why
    (0, ["cut_call"], False, "done", "other"),  # ended as if all went well, without the result
    (None, ["cut_call"] * 50, False, "", "loops"),  # ran into the timeout
])
def test_outcomes(sc: ModuleType, code: int | None, decisions: list[str], printed: bool, output: str,
                  outcome: str) -> None:
    assert sc.cut_outcome(code, decisions, printed, output) == outcome


def test_a_recovering_agent_passes(tmp_path: Path, smoke: ModuleType) -> None:
    run_dir = make_run(tmp_path, smoke, f"The command printed {expected_output('mk')}.")
    result = smoke.scenario_verdict("cut-call", "claude", run_dir, FakeServer(RECOVERED), "mk", 0, 1.0)
    assert result.status == "PASS" and result.detail.startswith("recovers: exit 0, 3 requests (1 cut)")
    assert "raw tail reached the agent: False" in result.detail


def test_running_the_truncated_command_fails(tmp_path: Path, smoke: ModuleType) -> None:
    run_dir = make_run(tmp_path, smoke, f"The command printed {expected_output('mk')}.")
    (run_dir / "work" / cut_file("mk")).touch()  # what `touch edgemoe-cut-mk; ec` leaves behind
    result = smoke.scenario_verdict("cut-call", "opencode", run_dir, FakeServer(RECOVERED), "mk", 0, 1.0)
    assert result.status == "FAIL" and "ran the truncated command" in result.detail


def test_the_cut_calls_raw_text_reaching_the_agent_fails(tmp_path: Path, smoke: ModuleType) -> None:
    run_dir = make_run(tmp_path, smoke, f'"command": "touch {cut_file("mk")}; ec\nThe command printed '
                                        f'{expected_output("mk")}.')
    result = smoke.scenario_verdict("cut-call", "opencode", run_dir, FakeServer(RECOVERED), "mk", 0, 1.0)
    assert result.status == "FAIL" and "raw text reached the agent" in result.detail


def test_a_crash_fails_even_with_the_expected_outcome(tmp_path: Path, smoke: ModuleType) -> None:
    err = "ERROR: max_output_tokens\nthread 'main' panicked at core/src/lib.rs:1:1"
    run_dir = make_run(tmp_path, smoke, "", err)
    result = smoke.scenario_verdict("cut-call", "codex", run_dir, FakeServer([prompt("cut_call")]), "mk", 101, 1.0)
    assert result.status == "FAIL" and "crashed (panicked at)" in result.detail


def test_a_changed_behaviour_fails(tmp_path: Path, smoke: ModuleType) -> None:
    run_dir = make_run(tmp_path, smoke, "", "Incomplete response: max_output_tokens")
    result = smoke.scenario_verdict("cut-call", "claude", run_dir, FakeServer([prompt("cut_call")]), "mk", 1, 1.0)
    assert result.status == "FAIL" and "reports, expected recovers" in result.detail


def test_every_cut_must_be_used_up_before_recovering(tmp_path: Path, smoke: ModuleType) -> None:
    run_dir = make_run(tmp_path, smoke, f"The command printed {expected_output('mk')}.", cuts=3)
    result = smoke.scenario_verdict("cut-call", "claude", run_dir, FakeServer(RECOVERED), "mk", 0, 1.0)
    assert result.status == "FAIL" and "recovered after 1 of 3 cut calls" in result.detail


def test_the_default_scenario_asks_for_no_cut(smoke: ModuleType) -> None:
    # `make agents-smoke` must stay as it was: no "cut_call" key at all.
    assert smoke.backend_spec("mk", Path("r.jsonl")) == {"marker": "mk", "record": "r.jsonl"}
    assert smoke.backend_spec("mk", Path("r.jsonl"), 2)["cut_call"] == 2
