"""The non-weight files of a Qwen3-family model directory, as the Hub ships them:
``tokenizer.json`` (Qwen3's real tokenizer), ``tokenizer_config.json`` with our chat
template, ``chat_template.jinja`` and ``generation_config.json``. Torch-free."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from edgemoe.assets.cache import write_json
from edgemoe.assets.chat_template import QWEN3_CHAT_TEMPLATE
from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json, tokenizer_config

ENDOFTEXT_ID = 151643  # <|endoftext|>: Qwen3's BOS, padding, and a second stop token


def write_tokenizer_files(out: Path) -> None:
    """Qwen3 tokenizer.json, tokenizer_config.json (with the chat template) and chat_template.jinja."""
    shutil.copyfile(qwen3_tokenizer_json(), out / "tokenizer.json")
    write_json(out / "tokenizer_config.json", {**tokenizer_config(), "chat_template": QWEN3_CHAT_TEMPLATE})
    (out / "chat_template.jinja").write_text(QWEN3_CHAT_TEMPLATE, encoding="utf-8")


def generation_config(config: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json for a model config: ids only, no sampling defaults.

    Like Qwen3's: generation also stops on <|endoftext|>, which doubles as padding.
    """
    eos = config.get("eos_token_id", 151645)
    stop = [*eos] if isinstance(eos, list) else [eos, ENDOFTEXT_ID]
    bos = config.get("bos_token_id", ENDOFTEXT_ID)
    return {"bos_token_id": bos, "eos_token_id": stop, "pad_token_id": ENDOFTEXT_ID}


def write_model_files(out: Path, config: dict[str, Any]) -> None:
    """config.json, generation_config.json and the tokenizer files into ``out``."""
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation_config(config))
    write_tokenizer_files(out)
