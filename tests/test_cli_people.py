"""The command line as a person meets it: what `--help` says, `--version`, a default for
every flag, arguments checked before any model loads, `ctl --url host:port`, `LLM.chat`."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import jinja2
import pytest

from edgemoe import __version__
from edgemoe.cli import Help, build_parser, main
from edgemoe.ctl import server_url


def _parsers(parser: argparse.ArgumentParser, path: str = "edgemoe"):  # noqa: ANN202
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_help_describes_the_product_and_version(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Mixture-of-Experts" in out and "getting started" in out
    for command in ("serve", "chat", "generate", "plan", "launch", "ctl", "bench"):
        assert f"\n    {command} " in out
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"edgemoe {__version__}"


def test_every_flag_says_its_default() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        formatter = Help(parser.prog)
        for action in parser._actions:
            if not action.option_strings or action.required or action.nargs == 0:
                continue  # positionals, required flags, switches, --help/--version
            if "default" not in (formatter._get_help_string(action) or ""):
                missing.append(f"{path} {action.option_strings[0]}")
    assert not missing, missing


def test_gpu_memory_default_reads_the_same_in_help_and_docs() -> None:
    from pathlib import Path

    serve = dict(_parsers(build_parser()))["edgemoe serve"]
    help_text = next(a.help for a in serve._actions if "--gpu-memory" in a.option_strings)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "offload.md").read_text()
    assert "90%% of the GPU's memory" in help_text and "90% of the GPU's memory" in docs


@pytest.mark.parametrize("argv,why", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--page-size", "0"], "page_size"),
])
def test_generate_checks_arguments_before_loading(argv: list[str], why: str, capsys) -> None:  # noqa: ANN001
    t0 = time.monotonic()
    assert main(["generate", "--prompt", "x", *argv]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err and "memory plan" not in err  # nothing was planned or loaded
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("given,url", [
    ("http://127.0.0.1:1919/", "http://127.0.0.1:1919"), ("localhost:8000", "http://localhost:8000"),
    (":9000", "http://127.0.0.1:9000"), ("9001", "http://127.0.0.1:9001"), ("https://h.example", "https://h.example"),
])
def test_server_url_accepts_what_people_type(given: str, url: str) -> None:
    assert server_url(given) == url


def test_ctl_reaches_a_server_by_host_port(scripted_url: str) -> None:
    out = subprocess.run([sys.executable, "-m", "edgemoe.cli", "ctl", "health", "--url", scripted_url.removeprefix("http://")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ok: model"), out.stderr


def test_llm_chat_applies_the_template(demo_llm) -> None:  # noqa: ANN001
    from edgemoe import SamplingParams

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    # The independent render: plain Jinja over the template file, as transformers does it.
    source = demo_llm.tokenizer.chat_template
    text = jinja2.Environment().from_string(source).render(messages=messages, add_generation_prompt=True)
    ids = demo_llm.tokenizer.encode(text, add_special_tokens=False)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    [chat] = demo_llm.chat(messages, greedy)
    [plain] = demo_llm.generate([ids], greedy)
    assert chat.prompt_token_ids == ids and chat.token_ids == plain.token_ids
    both = demo_llm.chat([messages, messages[1:]], greedy)  # several conversations at once
    assert len(both) == 2 and both[0].token_ids == plain.token_ids


@pytest.fixture(scope="module")
def demo_llm():  # noqa: ANN201
    from edgemoe import LLM

    with LLM() as llm:
        yield llm


@pytest.fixture(scope="module")
def scripted_url() -> str:
    import importlib.util
    from pathlib import Path

    here = Path(__file__).resolve().parent / "server"
    sys.path.insert(0, str(here))
    from server_harness import ScriptedEngine, ServerHarness

    from edgemoe.server.config import ServerConfig
    from edgemoe.testing import demo_model_path
    from edgemoe.tokenizer import TokenizerBundle

    assert importlib.util.find_spec("server_harness") is not None
    demo = demo_model_path()
    engine = ScriptedEngine(TokenizerBundle.load(demo))
    harness = ServerHarness(engine, engine.ready(demo), ServerConfig()).start()
    yield harness.base_url
    harness.stop()
