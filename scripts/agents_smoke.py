"""`make agents-smoke`: the real coding-agent CLIs, one turn with one tool call, against edgemoe.

For each of Claude Code (`claude -p`), Codex (`codex exec`) and OpenCode (`opencode run`):

1. install it from the npm registry into `.agents/` (ignored by git), unless present;
2. start `edgemoe serve` (demo tokenizer and template, an API key) with the scripted
   backend (`EDGEMOE_SCRIPTED_BACKEND`, see `edgemoe.testing.agent_backend`): it asks
   for a shell call that prints `edgemoe-smoke-42-MARKER`, and answers once a prompt
   carries that output back in a tool result;
3. run the agent non-interactively through `edgemoe launch AGENT --url URL -- ARGS` in a
   scratch HOME and work folder: launch configures it the way docs/agents.md tells users to;
4. pass when the recorded prompts show the tool result reaching the model and the
   agent printed the final answer.

`--scenario cut-call [--cuts N]`: the backend cuts the first N shell calls by a length limit
inside the command (the server returns each with `{}` arguments and finish_reason "length");
each agent passes when it crashed on nothing, never ran the truncated command, and either
recovered or reported the limit as it was seen to (`EXPECTED_CUT_OUTCOME`, docs/agents.md).
Logs in `.agents/runs/cut-call/AGENT/`, results in `.agents/results-cut-call.json`.

`--scenario parallel-calls`: the shell call is two calls in one answer; `--scenario thinking`: the
call and the answer start with a `<think>` block. How they are judged: scripts/agents_scenarios.py.
Logs and results as for cut-call, under the scenario's name.

Not part of `make test`: it needs the npm registry and takes a minute.
Exit status: 0 when every agent that installed passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from edgemoe.testing.agent_backend import FACTORY, cut_file, expected_output

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/ is no package: find the sibling module
from agents_scenarios import cut_call_verdict, parallel_verdict, thinking_verdict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
AGENTS_DIR = ROOT / ".agents"
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}
API_KEY = "smoke-key"
MODEL = "edgemoe"
PROMPT = "Run the smoke-test shell command once, then tell me exactly what it printed."
READY = re.compile(r"^edgemoe ready on http://127\.0\.0\.1:(\d+) ")
CLI = "import sys; from edgemoe.cli import main; sys.exit(main(sys.argv[1:]))"
AGENT_TIMEOUT_S = 300
SCENARIOS = ("tool-call", "cut-call", "parallel-calls", "thinking")
# The backend spec's switch for each scenario beyond the default one (cut-call's is its count).
_SCENARIO_SPEC = {"parallel-calls": "parallel", "thinking": "thinking"}


@dataclass
class Result:
    agent: str
    status: str  # PASS | FAIL | SKIP
    detail: str
    seconds: float = 0.0


# --------------------------------------------------------------------------- install


def install(agent: str) -> str | None:
    """Install the agent's package; None on success, else why not."""
    if (AGENTS_DIR / "node_modules" / ".bin" / agent).exists():
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed"
    proc = subprocess.run(
        [npm, "install", "--prefix", str(AGENTS_DIR), "--no-audit", "--no-fund", "--loglevel=error", PACKAGES[agent]],
        capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        return f"npm install {PACKAGES[agent]} failed: {(proc.stderr or proc.stdout).strip()[-400:]}"
    if not (AGENTS_DIR / "node_modules" / ".bin" / agent).exists():
        return f"npm installed {PACKAGES[agent]} but no `{agent}` command appeared"
    return None


# --------------------------------------------------------------------------- server


def backend_spec(marker: str, record: Path, cuts: int = 0, scenario: str = "tool-call") -> dict[str, object]:
    """The scripted backend's spec; `cuts` > 0: cut that many shell calls by a length limit first;
    `scenario` parallel-calls or thinking: that script instead (docs: `edgemoe.testing.agent_backend`)."""
    switch = {_SCENARIO_SPEC[scenario]: True} if scenario in _SCENARIO_SPEC else {}
    return {"marker": marker, "record": str(record), **({"cut_call": cuts} if cuts else {}), **switch}


class Server:
    """`edgemoe serve` with the scripted backend, recording every prompt to `record`."""

    def __init__(self, run_dir: Path, marker: str, cuts: int = 0, scenario: str = "tool-call") -> None:
        self.record = run_dir / "prompts.jsonl"
        spec = run_dir / "backend.json"
        spec.write_text(json.dumps(backend_spec(marker, self.record, cuts, scenario)))
        env = {**os.environ, "EDGEMOE_ENGINE_FACTORY": FACTORY, "EDGEMOE_SCRIPTED_BACKEND": str(spec)}
        self.log = (run_dir / "server.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLI, "serve", "--port", "0", "--api-key", API_KEY, "--served-model-name", MODEL],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=ROOT,
        )
        self.port = self._wait_ready()

    def _wait_ready(self, timeout: float = 120.0) -> int:
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout or []], daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                match = READY.match(lines.get(timeout=1.0))
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if match:
                return int(match.group(1))
        self.stop()
        raise RuntimeError(f"edgemoe serve did not become ready; see {self.log.name}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def prompts(self) -> list[dict[str, str]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# --------------------------------------------------------------------------- agents


def _base_env(home: Path) -> dict[str, str]:
    # A clean environment: the user's own keys and configs must neither leak in nor be touched.
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "TERM": "dumb", "LANG": "C.UTF-8", "NO_COLOR": "1"}


# Each agent runs through `edgemoe launch AGENT --url URL -- ARGS`, which supplies the
# settings docs/agents.md documents (environment, `-c` overrides, OPENCODE_CONFIG_CONTENT);
# ARGS are what makes each one run a single turn without asking.
AGENT_ARGS: dict[str, list[str]] = {
    "claude": ["-p", PROMPT, "--allowedTools", "Bash"],
    "codex": ["exec", "--strict-config", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", PROMPT],
    "opencode": ["run", PROMPT],
}


def launch_command(agent: str, server: Server, home: Path) -> tuple[list[str], dict[str, str]]:
    env = {**_base_env(home), "EDGEMOE_API_KEY": API_KEY,
           "PATH": f"{AGENTS_DIR / 'node_modules' / '.bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return [sys.executable, "-c", CLI, "launch", agent, "--url", server.url, "--", *AGENT_ARGS[agent]], env


def _bin(agent: str) -> str:
    return str(AGENTS_DIR / "node_modules" / ".bin" / agent)


def run_agent(agent: str, cuts: int = 0, scenario: str = "tool-call") -> Result:
    """One agent's run; `cuts` > 0: the cut-call scenario, cutting that many shell calls first;
    `scenario` parallel-calls or thinking: that one."""
    why = install(agent)
    if why is not None:
        return Result(agent, "SKIP", why)
    scenario = "cut-call" if cuts else scenario
    run_dir = AGENTS_DIR / "runs" / ("" if scenario == "tool-call" else scenario) / agent
    shutil.rmtree(run_dir, ignore_errors=True)
    home, work = run_dir / "home", run_dir / "work"
    home.mkdir(parents=True)
    work.mkdir()
    marker = uuid.uuid4().hex[:12]
    started = time.monotonic()
    server = Server(run_dir, marker, cuts, scenario)
    try:
        argv, env = launch_command(agent, server, home)
        with (run_dir / "agent.out").open("w") as out, (run_dir / "agent.err").open("w") as err:
            try:
                code = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                      timeout=AGENT_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                code = None
        if scenario == "tool-call":
            return _verdict(agent, run_dir, server, marker, code, time.monotonic() - started)
        return scenario_verdict(scenario, agent, run_dir, server, marker, code, time.monotonic() - started)
    finally:
        server.stop()


def _verdict(agent: str, run_dir: Path, server: Server, marker: str, code: int | None, seconds: float) -> Result:
    wanted = expected_output(marker)
    decisions = [p["decision"] for p in server.prompts()]
    printed = wanted in (run_dir / "agent.out").read_text(errors="replace")
    saw_result = "answer" in decisions  # the backend answers only once the tool result came back
    detail = f"exit {code}, requests {decisions}, answer printed: {printed}; logs in {run_dir.relative_to(ROOT)}"
    ok = code == 0 and "tool_call" in decisions and saw_result and printed
    return Result(agent, "PASS" if ok else "FAIL", detail, seconds)


def _tail(text: str, lines: int = 4) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def scenario_verdict(scenario: str, agent: str, run_dir: Path, server: Server, marker: str, code: int | None,
                     seconds: float) -> Result:
    """The cut-call, parallel-calls or thinking run judged (scripts/agents_scenarios.py); PASS: no problem."""
    prompts = server.prompts()
    out, err = _read(run_dir / "agent.out"), _read(run_dir / "agent.err")
    if scenario == "cut-call":
        cuts = int(json.loads((run_dir / "backend.json").read_text())["cut_call"])
        # Anything running the cut command's text creates this file: in the work folder, or wherever it ran.
        ran_cut = any(run_dir.rglob(cut_file(marker)))
        problems, detail = cut_call_verdict(agent, prompts, out, err, code, marker, cuts, ran_cut)
    elif scenario == "parallel-calls":
        problems, detail = parallel_verdict(prompts, out, err, code, marker, _read(run_dir / "server.log"))
    else:
        problems, detail = thinking_verdict(agent, prompts, out, err, code, marker, _read(run_dir / "server.log"))
    detail += (f"; stdout: {_tail(out)!r}; stderr: {_tail(err)!r}; {'; '.join(problems) + '; ' if problems else ''}"
               f"logs in {run_dir.relative_to(ROOT)}")
    return Result(agent, "FAIL" if problems else "PASS", detail, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("agents", nargs="*", help=f"any of {', '.join(PACKAGES)} (default: all)")
    parser.add_argument("--scenario", choices=SCENARIOS, default="tool-call",
                        help="tool-call: one shell call, then the answer (default); cut-call: the shell call is "
                             "first cut by a length limit inside its arguments; "
                             "parallel-calls: two shell calls in one answer; thinking: a <think> block before "
                             "the call and the answer (see scripts/agents_scenarios.py)")
    parser.add_argument("--cuts", type=int, default=1,
                        help="cut-call: how many shell calls are cut before one goes through (default 1)")
    args = parser.parse_args(argv)
    unknown = set(args.agents) - set(PACKAGES)
    if unknown:
        parser.error(f"unknown agents: {', '.join(sorted(unknown))}")
    if args.cuts < 1:
        parser.error("--cuts must be at least 1")
    AGENTS_DIR.mkdir(exist_ok=True)
    results = []
    for agent in args.agents or list(PACKAGES):
        try:
            result = run_agent(agent, args.cuts if args.scenario == "cut-call" else 0, args.scenario)
        except Exception as exc:  # one broken agent must not hide the others' results
            result = Result(agent, "FAIL", f"{type(exc).__name__}: {exc}")
        print(f"{result.agent:9} {result.status:4} ({result.seconds:.0f}s) {result.detail}", flush=True)
        results.append(result)
    name = "results.json" if args.scenario == "tool-call" else f"results-{args.scenario}.json"
    (AGENTS_DIR / name).write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0 if all(r.status != "FAIL" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
