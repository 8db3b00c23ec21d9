"""Hostile arguments to each subcommand's own flags: a message naming the flag or file at
fault and a non-zero exit, never a traceback, a hang, or the flag silently ignored."""

from __future__ import annotations

import http.server
import os
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgemoe.cli import build_parser, engine_settings, main

TINY = "random:tiny-qwen3-moe"
PLAN = ["plan", "--model", TINY, "--gpu-memory", "16GiB"]


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------- plan


@pytest.mark.parametrize("argv,flag", [
    (["--pcie-gbps", "-1"], "--pcie-gbps"),
    (["--device-gbps", "0", "--pcie-gbps", "10"], "--device-gbps"),
    (["--cpu-gbps", "nan"], "--cpu-gbps"),
    (["--pcie-gbps", "inf", "--device-gbps", "inf"], "--pcie-gbps"),  # was a ZeroDivisionError
    (["--cuda-context", "lots"], "--cuda-context"),  # was blamed on --gpu-memory
    (["--cuda-context", "."], "--cuda-context"),
    (["--max-prefill-tokens", "0"], "--max-prefill-tokens"),  # the engine's own checks, as `serve` has them
    (["--moe-slots", "-5"], "--moe-slots"),
    (["--cuda-graph-max-bs", "0"], "--cuda-graph-max-bs"),
])
def test_plan_refuses_bad_numbers(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, *argv]) == 2
    assert flag in _error(capsys)


@pytest.mark.parametrize("size", [".", "1.2.3GiB"])
def test_an_unparseable_size_names_the_flag(size: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", TINY, "--gpu-memory", size]) == 2
    err = _error(capsys)
    assert "--gpu-memory" in err and "could not convert" not in err


@pytest.mark.parametrize("content", [None, "[1, 2]", '{"experts": 5}', '{"copies": [1]}',
                                     '{"experts": [{"tokens": 1, "experts_per_call": 8, "gb_s": "x"}]}'])
def test_plan_names_a_bw_json_that_is_no_bench_bw_result(content: str | None, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path  # None: a directory
    if content is not None:
        path = tmp_path / "bw.json"
        path.write_text(content)
    assert main([*PLAN, "--bw-json", str(path)]) == 2
    assert f"--bw-json {path}" in _error(capsys)


def test_plan_refuses_a_bench_dir_that_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--bench-dir", str(tmp_path / "typo")]) == 2  # was: a plan without rates, exit 0
    assert "--bench-dir" in _error(capsys)


# --------------------------------------------------------------------------- --url of ctl, chat, launch, bench agent


@pytest.fixture
def no_local_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """`chat` must not fall back to a model in this process."""
    import edgemoe.chat

    def refuse(settings: object) -> None:
        raise AssertionError("chat loaded a model in-process")

    monkeypatch.setattr(edgemoe.chat, "_load", refuse)


@pytest.fixture
def fake_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """`launch` finds its agent and must not start a server."""
    import edgemoe.launch

    def refuse(settings: object) -> None:
        raise AssertionError("launch started a server")

    monkeypatch.setattr(edgemoe.launch, "agent_command", lambda agent: "/bin/true")
    monkeypatch.setattr(edgemoe.launch, "StartedServer", refuse)


@pytest.mark.parametrize("url", ["localhost:notaport", "", "ftp://127.0.0.1:1", "127.0.0.1:70000"])
@pytest.mark.parametrize("command", [["ctl", "health"], ["chat"], ["launch", "claude"], ["bench", "agent"]])
def test_a_url_that_is_no_address_is_named(command: list[str], url: str, tmp_path: Path, no_local_model: None,
                                           fake_agent: None, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--out", str(tmp_path)] if command[0] == "bench" else []
    assert main([*command, "--url", url, *out]) == 2  # "": was the in-process model / the default server
    assert f"--url {url!r}" in _error(capsys)


@pytest.fixture
def foreign_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """An HTTP server that is not edgemoe: GET path → the body in `routes` (status 200, or the
    one in `routes["status"]`), else 404."""
    routes: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = routes.get(self.path.split("?")[0])
            self.send_response(404 if body is None else int(routes.get("status", b"200")))
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", routes
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("what,body", [("health", b""), ("health", b'{"status": "ok"}'), ("stats", b"[]")])
def test_ctl_against_another_server_says_so(what: str, body: bytes, foreign_server: tuple[str, dict[str, bytes]],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    url, routes = foreign_server
    routes["/health"] = routes["/v1/stats"] = body
    assert main(["ctl", what, "--url", url]) == 1
    err = _error(capsys)
    assert "did not answer as an edgemoe server" in err and "--url" in err


def test_ctl_shows_another_server_s_error_text(foreign_server: tuple[str, dict[str, bytes]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    url, routes = foreign_server
    routes.update({"/health": b'{"error": "unauthorized"}', "status": b"401"})  # the error a string, not an object
    assert main(["ctl", "health", "--url", url]) == 1
    assert "error (401): unauthorized" in capsys.readouterr().out


@pytest.mark.parametrize("body", [b"hello", b'{"data": []}'])
def test_launch_against_another_server_says_so(body: bytes, foreign_server: tuple[str, dict[str, bytes]],
                                               fake_agent: None, capsys: pytest.CaptureFixture[str]) -> None:
    url, routes = foreign_server
    routes["/v1/models"] = body
    assert main(["launch", "claude", "--url", url]) == 2
    err = _error(capsys)
    assert "/v1/models" in err and "--url" in err


# --------------------------------------------------------------------------- chat, launch


@pytest.mark.parametrize("argv,flag", [
    (["--temperature", "nan"], "--temperature"),  # was: "Out of range float values are not JSON compliant" per turn
    (["--temperature", "-1"], "--temperature"),
    (["--max-tokens", "99999999999"], "--max-tokens"),
])
def test_chat_checks_sampling_flags_before_anything(argv: list[str], flag: str, no_local_model: None,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chat", *argv]) == 2
    assert flag in _error(capsys)


def test_launch_refuses_url_with_new_server(fake_agent: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "claude", "--url", "127.0.0.1:1", "--new-server"]) == 2
    err = _error(capsys)
    assert "--url" in err and "--new-server" in err


def test_launch_says_when_its_server_does_not_start(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "claude").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("EDGEMOE_API_KEY", None)
    done = subprocess.run([sys.executable, "-m", "edgemoe.cli", "launch", "claude", "--new-server",
                           "--model", str(tmp_path / "nope")], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "--model" in done.stderr and "edgemoe serve did not start" in done.stderr


SWITCHES = {"overlap": False, "prompt_cpu": True, "no_cuda_graph": True, "page_size": 4, "cache_type": "none"}


def _round_trip(serve_argv: list[str]) -> dict[str, object]:
    """The settings a child `edgemoe serve` gets from its argv (the real parser)."""
    return engine_settings(build_parser().parse_args(serve_argv))


def test_launch_passes_every_switch_to_its_server(monkeypatch: pytest.MonkeyPatch) -> None:
    import edgemoe.launch

    seen: list[list[str]] = []
    monkeypatch.setattr(edgemoe.launch.subprocess, "Popen", lambda argv, **kw: seen.append(argv))
    edgemoe.launch.StartedServer(SWITCHES)
    assert _round_trip(seen[0][3:]) == SWITCHES  # --no-overlap was dropped


def test_bench_agent_passes_every_switch_to_its_servers() -> None:
    from edgemoe.bench.server_proc import serve_command

    assert _round_trip(serve_command(SWITCHES, 0)[3:]) == SWITCHES  # was `--no-cuda-graph True`: serve refused


# --------------------------------------------------------------------------- serve


@pytest.mark.parametrize("argv,flag", [
    (["--host", ""], "--host"),  # was: listening on every interface
    (["--served-model-name", ""], "--served-model-name"),
    (["--api-key", ""], "--api-key"),  # was: served without a key
])
def test_serve_refuses_empty_values(argv: list[str], flag: str, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    import edgemoe.serve

    def refuse(*args: object) -> int:
        raise AssertionError("serve started")

    monkeypatch.setattr(edgemoe.serve, "run_serve", refuse)
    assert main(["serve", "--port", "0", *argv]) == 2
    assert flag in _error(capsys)


def test_serve_checks_engine_settings_before_starting_the_engine(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import edgemoe.serve

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the engine process was started")

    monkeypatch.setattr(edgemoe.serve, "_Serve", refuse)  # was: the engine's failure, printed twice, ~3 s later
    assert main(["serve", "--port", "0", "--kv-tokens", "0"]) == 2
    assert "--kv-tokens" in _error(capsys)


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve", "--port", "0"]])
def test_a_negative_engine_seed_is_refused(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # random.Random(-5) is Random(5): two seeds would have named one generator
    assert main([*command, "--seed", "-5"]) == 2
    assert "--seed" in _error(capsys)


# --------------------------------------------------------------------------- convert


def test_convert_names_a_model_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.txt").write_text("not a checkpoint")
    assert main(["convert", "--model", str(tmp_path / "model.txt"), "--expert-dtype", "fp8",
                 "--out", str(tmp_path / "out")]) == 2
    assert "--model" in _error(capsys)


def test_convert_refuses_an_unmakeable_out_before_loading(qwen3_ckpt: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import edgemoe.convert

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded the checkpoint first")

    monkeypatch.setattr(edgemoe.convert, "load_checkpoint", refuse)
    (tmp_path / "file").write_text("x")
    assert main(["convert", "--model", str(qwen3_ckpt), "--expert-dtype", "fp8",
                 "--out", str(tmp_path / "file" / "out")]) == 2
    assert "--out" in _error(capsys)


@pytest.mark.parametrize("existed", [False, True], ids=["made-by-convert", "empty-before"])
def test_a_failed_convert_leaves_no_half_written_out(existed: bool, qwen3_ckpt: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A convert that fails after it began writing (here: the experts' step) takes back what
    it wrote: `--out` is gone where convert made it, empty again where it was empty."""
    import edgemoe.convert

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(edgemoe.convert, "_write_experts", fail)
    out = tmp_path / "out"
    if existed:
        out.mkdir()
    with pytest.raises(OSError, match="No space left"):
        edgemoe.convert.convert(qwen3_ckpt, "fp8", out, progress=False)
    assert (list(out.iterdir()) == []) if existed else not out.exists()


def test_convert_says_a_write_failure_in_a_message(qwen3_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import edgemoe.convert

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(edgemoe.convert, "_write_experts", fail)
    assert main(["convert", "--model", str(qwen3_ckpt), "--expert-dtype", "fp8", "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "No space left on device" in err and "--out" in err and not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- bench


BW = ["bench", "bw", "--seconds", "0", "--weights", "bf16", "--prompt-shapes"]


@pytest.mark.parametrize("argv,flag", [
    (["--kernels", "bogus", "--read-gib", "0.01", "--pool-mib", "8"], "--kernels"),  # was an IndexError
    (["--kernels", "torch", "--read-gib", "1e6"], "--read-gib"),  # was torch's allocation error
    (["--kernels", "torch", "--read-gib", "0.01", "--pool-mib", "999999999999"], "--pool-mib"),
])
def test_bench_bw_names_the_flag(argv: list[str], flag: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BW, *argv, "--out", str(tmp_path)]) == 2
    assert flag in _error(capsys)


def test_bench_decode_refuses_a_batch_the_engine_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import edgemoe.bench.decode

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured: 9 requests through 2 running at once take hours at real sizes")

    monkeypatch.setattr(edgemoe.bench.decode, "measure", refuse)
    assert main(["bench", "decode", "--model", TINY, "--max-running-requests", "2", "--batch-sizes", "9",
                 "--prompt-tokens", "4", "--decode-tokens", "2", "--out", str(tmp_path)]) == 2
    err = _error(capsys)
    assert "--batch-sizes 9" in err and "--max-running-requests" in err


@pytest.mark.parametrize("argv,flag", [(["--moe-backend", "offload"], "--moe-backend"),  # was an AttributeError
                                       (["--expert-dtype", "fp8"], "--expert-dtype")])  # was a quantised reference
def test_bench_quant_error_refuses_what_changes_its_reference(argv: list[str], flag: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "quant-error", "--model", TINY, *argv, "--prompts", "1", "--prompt-tokens", "8",
                 "--formats", "fp8", "--out", str(tmp_path)]) == 2
    assert flag in _error(capsys)


def test_bench_agent_cache_types_are_checked_by_the_parser() -> None:
    with pytest.raises(SystemExit) as e:  # was: a server started with it, refused, then a RuntimeError
        build_parser().parse_args(["bench", "agent", "--cache-types", "bogus"])
    assert e.value.code == 2


def test_bench_agent_refuses_engine_flags_with_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "agent", "--url", "127.0.0.1:1", "--page-size", "4", "--out", str(tmp_path)]) == 2
    assert "engine flags (page_size)" in _error(capsys)  # was: ignored


def test_bench_agent_reports_an_unreachable_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "agent", "--url", "127.0.0.1:1", "--turns", "1", "--out", str(tmp_path)]) == 1
    assert "--url http://127.0.0.1:1" in _error(capsys)


def test_bench_agent_says_when_its_server_does_not_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "agent", "--model", str(tmp_path / "nope"), "--cache-types", "radix", "--turns", "1",
                 "--out", str(tmp_path)]) == 1
    assert "edgemoe serve exited with" in _error(capsys)



def test_generate_refuses_an_empty_prompt_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    """`generate --prompt ""` failed after the model load with a message naming no flag."""
    assert main(["generate", "--model", "/nonexistent-model-dir", "--prompt", ""]) == 2  # before --model is read
    assert "--prompt is empty" in capsys.readouterr().err


def test_bench_decode_skips_a_batch_the_kv_cache_cannot_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --kv-tokens 64 (pages of 16) a batch of 4 requests of 24 + 4 tokens needs 128
    tokens of KV: the scheduler would run it two at a time, labelled batch 4. It is skipped
    and said (stdout and the JSON's `skipped`); the batches that fit run."""
    assert main(["bench", "decode", "--model", TINY, "--kv-tokens", "64", "--prompt-tokens", "24",
                 "--batch-sizes", "1", "2", "4", "--decode-tokens", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped prompt 24 x batch 4" in out and "--kv-tokens" in out
    (result,) = tmp_path.glob("decode-*.json")
    data = json.loads(result.read_text())
    assert [(r["prompt_tokens"], r["batch"]) for r in data["rows"]] == [(24, 1), (24, 2)]
    assert data["skipped"] == [{"prompt_tokens": 24, "batch": 4, "kv_tokens_needed": 128, "kv_tokens": 64}]


def test_bench_decode_refuses_when_no_run_fits_the_kv_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "decode", "--model", TINY, "--kv-tokens", "32", "--prompt-tokens", "40",
                 "--batch-sizes", "1", "--decode-tokens", "4", "--out", str(tmp_path)]) == 2
    assert "--kv-tokens" in _error(capsys) and not list(tmp_path.glob("decode-*.json"))


def test_bench_decode_refuses_a_prompt_past_the_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt and its decode past the context failed after the load with the engine's
    message, naming no flag."""
    import edgemoe.bench.decode

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured a run the context cannot hold")

    monkeypatch.setattr(edgemoe.bench.decode, "measure", refuse)
    assert main(["bench", "decode", "--model", TINY, "--max-model-len", "64", "--prompt-tokens", "60",
                 "--decode-tokens", "8", "--out", str(tmp_path)]) == 2
    err = _error(capsys)
    assert "--prompt-tokens 60" in err and "--decode-tokens 8" in err and "--max-model-len" in err
