"""`edgemoe launch`: each agent gets the settings docs/agents.md documents and reaches the
server with them (a stand-in agent on PATH records what it got and calls the API); a
server it started is stopped afterwards; a missing agent is a message and exit 127."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

KEY = "sk-launch"
FAKE_AGENT = """#!{python}
import json, os, sys, httpx
env = {{k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC_", "CLAUDE_", "EDGEMOE_", "OPENCODE_"))}}
agent = os.path.basename(sys.argv[0])
if agent == "claude":
    r = httpx.post(env["ANTHROPIC_BASE_URL"] + "/v1/messages", timeout=60,
                   headers={{"Authorization": "Bearer " + env["ANTHROPIC_AUTH_TOKEN"]}},
                   json={{"model": env["ANTHROPIC_MODEL"], "max_tokens": 4, "messages": [{{"role": "user", "content": "hi"}}]}})
    status = r.status_code
    url = env["ANTHROPIC_BASE_URL"]
elif agent == "opencode":
    provider = json.loads(env["OPENCODE_CONFIG_CONTENT"])["provider"]["edgemoe"]["options"]
    url = provider["baseURL"].removesuffix("/v1")
    status = httpx.get(provider["baseURL"] + "/models", headers={{"Authorization": "Bearer " + env["EDGEMOE_API_KEY"]}}).status_code
else:
    url, status = None, None
json.dump({{"argv": sys.argv[1:], "env": env, "status": status, "url": url}}, open(os.environ["FAKE_AGENT_OUT"], "w"))
sys.exit(3)
"""


@pytest.fixture
def agents_path(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("claude", "codex", "opencode"):
        path = bin_dir / name
        path.write_text(FAKE_AGENT.format(python=sys.executable))
        path.chmod(0o755)
    return bin_dir


def _launch(args: list[str], path: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    full = {**os.environ, "PATH": path, "FAKE_AGENT_OUT": str(out),
            "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])), **env}
    full.pop("EDGEMOE_API_KEY", None)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "edgemoe.cli", "launch", *args], capture_output=True, text=True,
                          env=full, timeout=180)


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode"])
def test_each_agent_gets_its_settings(agent: str, agents_path: Path, make_scripted, tmp_path: Path) -> None:  # noqa: ANN001
    server = make_scripted(api_key=KEY, served_model_name="qwen-test")
    out = tmp_path / "agent.json"
    done = _launch([agent, "--url", server.base_url.removeprefix("http://"), "--", "-p", "do it"],
                   f"{agents_path}:{os.environ['PATH']}", out, EDGEMOE_API_KEY=KEY)
    assert done.returncode == 3, done.stderr  # the agent's own status
    got = json.loads(out.read_text())
    env = got["env"]
    assert got["argv"][-2:] == ["-p", "do it"]
    if agent == "claude":
        assert env["ANTHROPIC_BASE_URL"] == server.base_url and env["ANTHROPIC_AUTH_TOKEN"] == KEY
        assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "qwen-test"
        assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and got["status"] == 200
    elif agent == "codex":
        overrides = dict(o.split("=", 1) for o in got["argv"][1:-2:2])
        assert got["argv"][0:-2:2] == ["-c"] * len(overrides)
        config = tomllib.loads("\n".join(f"{k} = {v}" for k, v in overrides.items() if "." not in k))
        provider = tomllib.loads("p = " + overrides["model_providers.edgemoe"])["p"]
        assert config == {"model": "qwen-test", "model_provider": "edgemoe", "model_context_window": 4096}
        assert provider == {"name": "edgemoe", "base_url": server.base_url + "/v1", "wire_api": "responses",
                            "env_key": "EDGEMOE_API_KEY"}
        assert env["EDGEMOE_API_KEY"] == KEY
    else:
        config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
        assert config["model"] == "edgemoe/qwen-test" and got["status"] == 200
        assert config["provider"]["edgemoe"]["models"]["qwen-test"]["limit"]["context"] == 4096


def test_starts_and_stops_its_own_server(agents_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "agent.json"
    done = _launch(["claude", "--new-server", "--", "--version"], f"{agents_path}:{os.environ['PATH']}", out)
    assert done.returncode == 3, done.stderr
    got = json.loads(out.read_text())
    assert got["status"] == 200 and got["env"]["ANTHROPIC_AUTH_TOKEN"] not in done.stderr  # a fresh key, not printed
    with pytest.raises(httpx.TransportError):  # the server it started is gone
        httpx.get(got["url"] + "/health", timeout=2)


def test_missing_agent_is_a_message(tmp_path: Path) -> None:
    done = _launch(["codex"], str(tmp_path), tmp_path / "none.json")
    assert done.returncode == 127
    assert "Codex is not installed" in done.stderr and "npm install -g @openai/codex" in done.stderr


@pytest.mark.parametrize("context,window", [(4096, None), (32767, None), (32768, "32768"), (262144, "262144")])
def test_claude_code_hears_the_servers_window_where_it_can_compact_ahead(context: int, window: str | None) -> None:
    # Claude Code 2.1.337 takes a model it doesn't know for a 1M window, so it never compacted
    # ahead; below 32K its ~12K prompt and 20K output reserve leave it nothing to compact into.
    from edgemoe.launch import Endpoint, claude_env

    _, env = claude_env(Endpoint("http://127.0.0.1:1919", None, "qwen3-coder", context))
    assert env.get("CLAUDE_CODE_MAX_CONTEXT_TOKENS") == window

