"""Small pure pieces of the server: sizes, error params, thinking resolution, token bytes, torch-freedom."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgemoe.server.config import ServerConfig, parse_size
from edgemoe.server.errors import param_of
from edgemoe.server.generation import thinking_from
from edgemoe.server.logprobs import TokenTexts
from edgemoe.tokenizer import TokenizerBundle


@pytest.mark.parametrize(
    ("text", "size"),
    [("32MiB", 32 * 2**20), ("1GB", 10**9), ("512k", 512 * 1024), ("1048576", 2**20), ("1.5KiB", 1536), ("2 mb", 2 * 10**6)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_junk() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_server_config_validates() -> None:
    assert ServerConfig().max_body_size == 32 * 2**20
    for bad in ({"port": 70000}, {"default_thinking_mode": "maybe"}, {"tool_call_parser": "nope"}, {"max_body_size": 0}):
        with pytest.raises(ValueError):
            ServerConfig(**bad)  # type: ignore[arg-type]


def test_param_of() -> None:
    assert param_of(("body", "messages", 0, "role")) == "messages[0].role"
    assert param_of(("body",)) is None
    assert param_of(("body", "tools", 1)) == "tools[1]"


@pytest.mark.parametrize(
    ("enable", "effort", "expected"),
    [(None, None, None), (True, "none", True), (False, "high", False), (None, "none", False),
     (None, "minimal", False), (None, "low", True), (None, "xhigh", True), ("yes", None, None)],
)
def test_thinking_from(enable: object, effort: str | None, expected: bool | None) -> None:
    assert thinking_from(enable, effort) == expected


def test_token_bytes_rebuild_utf8(demo_tokenizer: TokenizerBundle) -> None:
    texts = TokenTexts(demo_tokenizer.tokenizer)
    for text in ("naïve café — 你好 🎉", " hello world", "<|im_end|><think>x</think>"):
        ids = demo_tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(texts.token_bytes(i) for i in ids).decode() == text
    (im_end,) = demo_tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert texts.text(im_end) == "<|im_end|>"


def test_server_imports_no_torch() -> None:
    """The server process must never import torch, directly or not."""
    code = (
        "import pkgutil, importlib, sys\n"
        "import edgemoe.server, edgemoe.serve, edgemoe.cli\n"
        "for m in pkgutil.walk_packages(edgemoe.server.__path__, 'edgemoe.server.'):\n"
        "    importlib.import_module(m.name)\n"
        "from edgemoe.cli import build_parser\n"
        "build_parser().parse_args(['serve'])\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
