"""`make agents-smoke`: the real coding-agent CLIs, one turn with one tool call, against edgemoe.

For each of Claude Code (`claude -p`), Codex (`codex exec`) and OpenCode (`opencode run`):

1. install it from the npm registry into `.agents/` (ignored by git), unless present;
2. start `edgemoe serve` (demo tokenizer and template, an API key) with the scripted
   backend (`EDGEMOE_SCRIPTED_BACKEND`, see `edgemoe.testing.agent_backend`): it asks
   for a shell call that prints `edgemoe-smoke-42-MARKER`, and answers once a prompt
   carries that output back in a tool result;
3. run the agent non-interactively in a scratch HOME and work folder, configured the
   way docs/agents.md tells users to;
4. pass when the recorded prompts show the tool result reaching the model and the
   agent printed the final answer.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgemoe.testing.agent_backend import FACTORY, expected_output

ROOT = Path(__file__).resolve().parent.parent
AGENTS_DIR = ROOT / ".agents"
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}
API_KEY = "smoke-key"
MODEL = "edgemoe"
PROMPT = "Run the smoke-test shell command once, then tell me exactly what it printed."
READY = re.compile(r"^edgemoe ready on http://127\.0\.0\.1:(\d+) ")
CLI = "import sys; from edgemoe.cli import main; sys.exit(main(sys.argv[1:]))"
AGENT_TIMEOUT_S = 300


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


class Server:
    """`edgemoe serve` with the scripted backend, recording every prompt to `record`."""

    def __init__(self, run_dir: Path, marker: str) -> None:
        self.record = run_dir / "prompts.jsonl"
        spec = run_dir / "backend.json"
        spec.write_text(json.dumps({"marker": marker, "record": str(self.record)}))
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


def claude_command(server: Server, home: Path, work: Path) -> tuple[list[str], dict[str, str]]:
    env = {
        **_base_env(home),
        "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_AUTH_TOKEN": API_KEY, "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return [_bin("claude"), "-p", PROMPT, "--allowedTools", "Bash"], env


def codex_command(server: Server, home: Path, work: Path) -> tuple[list[str], dict[str, str]]:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "edgemoe"\nmodel_context_window = 32768\n\n'
        '[model_providers.edgemoe]\nname = "edgemoe"\n'
        f'base_url = "{server.url}/v1"\nwire_api = "responses"\nenv_key = "EDGEMOE_API_KEY"\n'
    )
    env = {**_base_env(home), "CODEX_HOME": str(codex_home), "EDGEMOE_API_KEY": API_KEY}
    return [_bin("codex"), "exec", "--strict-config", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox", PROMPT], env


def opencode_command(server: Server, home: Path, work: Path) -> tuple[list[str], dict[str, str]]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"edgemoe": {
            "npm": "@ai-sdk/openai-compatible", "name": "edgemoe",
            "options": {"baseURL": f"{server.url}/v1", "apiKey": "{env:EDGEMOE_API_KEY}"},
            "models": {MODEL: {"name": "edgemoe", "limit": {"context": 32768, "output": 8192}}},
        }},
        "model": f"edgemoe/{MODEL}",
    }
    (work / "opencode.json").write_text(json.dumps(config, indent=2))
    env = {**_base_env(home), "EDGEMOE_API_KEY": API_KEY}
    return [_bin("opencode"), "run", "--auto", PROMPT], env


COMMANDS: dict[str, Callable[[Server, Path, Path], tuple[list[str], dict[str, str]]]] = {
    "claude": claude_command, "codex": codex_command, "opencode": opencode_command,
}


def _bin(agent: str) -> str:
    return str(AGENTS_DIR / "node_modules" / ".bin" / agent)


def run_agent(agent: str) -> Result:
    why = install(agent)
    if why is not None:
        return Result(agent, "SKIP", why)
    run_dir = AGENTS_DIR / "runs" / agent
    shutil.rmtree(run_dir, ignore_errors=True)
    home, work = run_dir / "home", run_dir / "work"
    home.mkdir(parents=True)
    work.mkdir()
    marker = uuid.uuid4().hex[:12]
    started = time.monotonic()
    server = Server(run_dir, marker)
    try:
        argv, env = COMMANDS[agent](server, home, work)
        with (run_dir / "agent.out").open("w") as out, (run_dir / "agent.err").open("w") as err:
            try:
                code = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                      timeout=AGENT_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                code = None
        return _verdict(agent, run_dir, server, marker, code, time.monotonic() - started)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("agents", nargs="*", help=f"any of {', '.join(PACKAGES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.agents) - set(PACKAGES)
    if unknown:
        parser.error(f"unknown agents: {', '.join(sorted(unknown))}")
    AGENTS_DIR.mkdir(exist_ok=True)
    results = []
    for agent in args.agents or list(PACKAGES):
        try:
            result = run_agent(agent)
        except Exception as exc:  # one broken agent must not hide the others' results
            result = Result(agent, "FAIL", f"{type(exc).__name__}: {exc}")
        print(f"{result.agent:9} {result.status:4} ({result.seconds:.0f}s) {result.detail}", flush=True)
        results.append(result)
    (AGENTS_DIR / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0 if all(r.status != "FAIL" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
