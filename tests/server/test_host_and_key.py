"""Issue 11, item 9: a Host allow-list and an Origin check against DNS rebinding and
cross-site pages, and the API key from a file or the environment rather than argv."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import MakeServer, ServerHarness

from edgemoe.server.api_key import ENV_VAR, resolve_api_key
from edgemoe.server.host_check import HostPolicy, hostname

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def server(make_scripted: MakeServer) -> ServerHarness:
    return make_scripted()


def port(h: ServerHarness) -> str:
    return h.base_url.rsplit(":", 1)[1]


def post(h: ServerHarness, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(h.base_url + path, json=body, headers=headers, timeout=10)


def test_a_rebound_host_is_refused_before_the_engine_sees_anything(server: ServerHarness) -> None:
    seen = len(server.engine.seen)
    evil = f"evil.example:{port(server)}"
    r = post(server, "/v1/chat/completions", CHAT, host=evil)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "host_not_allowed" and "--allowed-hosts" in r.json()["error"]["message"]
    r = post(server, "/v1/messages", MESSAGES, host=evil)
    assert r.status_code == 403 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "permission_error"
    assert httpx.get(server.base_url + "/health", headers={"host": evil}).status_code == 403
    assert len(server.engine.seen) == seen


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]", "app.localhost"])
def test_local_names_are_served(server: ServerHarness, host: str) -> None:
    r = post(server, "/v1/chat/completions", CHAT, host=f"{host}:{port(server)}")
    assert r.status_code == 200, r.text


def test_a_foreign_origin_is_refused(server: ServerHarness) -> None:
    own = f"127.0.0.1:{port(server)}"
    for origin in ["https://evil.example", "null", f"http://localhost:{int(port(server)) + 1}"]:
        r = post(server, "/v1/chat/completions", CHAT, host=own, origin=origin)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin
    r = post(server, "/v1/messages", MESSAGES, host=own, origin="https://evil.example")
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    # A page served by this server itself (same origin) may call it.
    assert post(server, "/v1/chat/completions", CHAT, host=own, origin=f"http://{own}").status_code == 200


def test_allowed_hosts_adds_names_and_star_allows_any(make_scripted: MakeServer) -> None:
    named = make_scripted(allowed_hosts="chat.example, other.example")
    p = port(named)
    assert post(named, "/v1/chat/completions", CHAT, host=f"chat.example:{p}").status_code == 200
    assert post(named, "/v1/chat/completions", CHAT, host=f"127.0.0.1:{p}",
                origin="https://chat.example").status_code == 200
    assert post(named, "/v1/chat/completions", CHAT, host=f"evil.example:{p}").status_code == 403
    assert post(named, "/v1/chat/completions", CHAT, host=f"127.0.0.1:{p}",
                origin="https://evil.example").status_code == 403
    anything = make_scripted(allowed_hosts="*")
    assert post(anything, "/v1/chat/completions", CHAT, host="evil.example",
                origin="https://evil.example").status_code == 200


def test_policy_when_bound_to_every_interface() -> None:
    policy = HostPolicy.of("0.0.0.0", None)
    assert policy.host_ok("192.168.7.21") and policy.host_ok("fe80::1") and policy.host_ok("localhost")
    assert policy.host_ok(socket.gethostname().lower())
    assert not policy.host_ok("evil.example")
    specific = HostPolicy.of("10.1.2.3", None)
    assert specific.host_ok("10.1.2.3") and not specific.host_ok("10.1.2.4")
    assert hostname("[::1]:1919") == "::1" and hostname("Example.COM.:80") == "example.com"


# --------------------------------------------------------------------------- the API key's source


def test_key_precedence_flag_file_environment(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    key_file.chmod(0o600)
    env = {ENV_VAR: "from-env"}
    with caplog.at_level(logging.WARNING):
        assert resolve_api_key("from-flag", None, env) == "from-flag"
    assert "process list" in caplog.text
    assert resolve_api_key(None, str(key_file), env) == "from-file"
    assert resolve_api_key(None, None, env) == "from-env"
    assert resolve_api_key(None, None, {}) is None
    with pytest.raises(ValueError, match="not both"):
        resolve_api_key("a", str(key_file), env)


@pytest.mark.parametrize(("content", "error"), [(None, "cannot read"), ("", "one line"), ("a\nb", "one line")])
def test_bad_key_files_are_named(tmp_path: Path, content: str | None, error: str) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=rf"--api-key-file {path}.*{error}"):
        resolve_api_key(None, str(path), {})


def test_a_key_file_others_can_read_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "key"
    path.write_text("k")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert resolve_api_key(None, str(path), {}) == "k"
    assert "chmod 600" in caplog.text


def test_serve_takes_the_key_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`edgemoe serve` (cli.main) resolves the key before building its ServerConfig."""
    import edgemoe.serve
    from edgemoe.cli import main

    configs: list[Any] = []
    monkeypatch.setattr(edgemoe.serve, "run_serve", lambda config, settings: configs.append(config) or 0)
    key_file = tmp_path / "key"
    key_file.write_text("sk-file\n")
    key_file.chmod(0o600)
    monkeypatch.setenv(ENV_VAR, "sk-env")
    assert main(["serve", "--api-key-file", str(key_file)]) == 0
    assert main(["serve"]) == 0
    assert main(["serve", "--api-key", "x", "--api-key-file", str(key_file)]) == 2  # both: an error
    assert [c.api_key for c in configs] == ["sk-file", "sk-env"]
