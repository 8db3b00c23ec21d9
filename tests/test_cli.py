"""The CLI parses every subcommand and reports bad input as a message, not a traceback."""

from __future__ import annotations

import subprocess
import sys

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
