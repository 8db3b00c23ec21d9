"""The CLI parses every subcommand and reports bad input as a message, not a traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgemoe.cli import build_parser, main


@pytest.mark.parametrize(
    "argv",
    [["generate", "--help"], ["serve", "--help"], ["bench", "decode", "--help"], ["bench", "agent", "--help"], ["bench", "bw", "--help"]],
)
def test_every_subcommand_has_help(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 0


def test_engine_flags_are_the_config_fields() -> None:
    args = build_parser().parse_args(["generate", "--prompt", "x", "--page-size", "4", "--moe-backend", "offload"])
    assert args.page_size == 4 and args.moe_backend == "offload"


def test_a_setting_decided_at_start_up_has_both_switches() -> None:
    from edgemoe.cli import engine_settings

    parse = build_parser().parse_args
    assert engine_settings(parse(["generate", "--prompt", "x", "--overlap"]))["overlap"] is True
    assert engine_settings(parse(["generate", "--prompt", "x", "--no-overlap"]))["overlap"] is False
    assert "overlap" not in engine_settings(parse(["generate", "--prompt", "x"]))  # the config's default: auto


def test_bad_model_dir_is_a_message(tmp_path, capsys) -> None:  # noqa: ANN001
    assert main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "no such directory" in err and "Traceback" not in err


def test_generate_runs_end_to_end(qwen3_ckpt) -> None:  # noqa: ANN001
    out = subprocess.run(
        [sys.executable, "-m", "edgemoe.cli", "generate", "--model", str(qwen3_ckpt), "--prompt", "Hello",
         "--chat", "--max-tokens", "5", "--dtype", "float32"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "finish_reason=length" in out.stdout


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "", "meta", "CPU"])
def test_a_device_the_engine_cannot_run_on_names_the_flag(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each was a traceback from torch.device (or, for meta, from the first operator)."""
    assert main(["generate", "--model", "random:tiny-qwen3-moe", "--prompt", "x", "--device", device]) == 2
    err = capsys.readouterr().err
    assert "--device" in err and "Traceback" not in err


@pytest.mark.parametrize("source,said", [("{{ raise_exception('no tools here') }}", "no tools here"),
                                         ("{{ foo.bar }}", "'foo' is undefined"),
                                         ("{% for x in %}", "does not compile")])
def test_chat_names_the_template_that_fails(source: str, said: str, qwen3_ckpt: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The template's own words were printed without the file they came from."""
    model = Path(shutil.copytree(qwen3_ckpt, tmp_path / "m"))
    (model / "chat_template.jinja").write_text(source)
    argv = ["generate", "--model", str(model), "--prompt", "x", "--chat", "--max-tokens", "1", "--dtype", "float32"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(model / "chat_template.jinja") in err and said in err and "Traceback" not in err


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_cache_dir_that_cannot_be_made_names_the_variable(under: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A file there was "[Errno 17] File exists", a file above it a NotADirectoryError traceback."""
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("EDGEMOE_CACHE_DIR", str(tmp_path / "file" / under))
    assert main(["generate", "--prompt", "x"]) == 2  # the demo model lives in the cache directory
    assert "EDGEMOE_CACHE_DIR=" in capsys.readouterr().err


@pytest.mark.parametrize("model,said", [("", "is empty"), ("config.json", "not a directory")])
def test_a_model_that_is_no_directory_says_what_it_is(model: str, said: str, qwen3_ckpt: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """"" read the working directory ("config.json: file not found"); a file was "no such directory"."""
    given = str(qwen3_ckpt / model) if model else model
    assert main(["generate", "--model", given, "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and said in err
