"""The non-weight files of a Qwen-family model directory, as the Hub ships them:
``tokenizer.json`` (the real tokenizer: Qwen3's, or Qwen3.5/3.6's for a model whose
vocabulary holds it), ``tokenizer_config.json`` with our chat template,
``chat_template.jinja`` and ``generation_config.json``. Torch-free."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from edgemoe.assets.cache import write_json
from edgemoe.assets.chat_template import QWEN3_5_CHAT_TEMPLATE, QWEN3_CHAT_TEMPLATE
from edgemoe.assets.qwen3_tokenizer import (
    QWEN3,
    QWEN3_5,
    QwenVocab,
    qwen_tokenizer_json,
    tokenizer_config,
)

ENDOFTEXT_ID = 151643  # <|endoftext|>: Qwen3's BOS, padding, and a second stop token
TEMPLATES = {QWEN3.name: QWEN3_CHAT_TEMPLATE, QWEN3_5.name: QWEN3_5_CHAT_TEMPLATE}


def vocab_for(config: dict[str, Any]) -> QwenVocab:
    """Qwen3.5/3.6's tokenizer when the model's vocabulary holds all of its ids (248,320 in
    the real models), else Qwen3's (151,936; the tiny test models of every family)."""
    text = config.get("text_config") or config
    qwen35 = QWEN3_5.num_ranks + len(QWEN3_5.added_tokens)
    return QWEN3_5 if int(text.get("vocab_size", 0)) >= qwen35 else QWEN3


def write_tokenizer_files(out: Path, vocab: QwenVocab = QWEN3) -> None:
    """tokenizer.json, tokenizer_config.json (with the chat template) and chat_template.jinja."""
    template = TEMPLATES[vocab.name]
    shutil.copyfile(qwen_tokenizer_json(vocab), out / "tokenizer.json")
    write_json(out / "tokenizer_config.json", {**tokenizer_config(vocab), "chat_template": template})
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")


def generation_config(config: dict[str, Any], endoftext: int = ENDOFTEXT_ID) -> dict[str, Any]:
    """generation_config.json for a model config: ids only, no sampling defaults.

    Like Qwen3's: generation also stops on <|endoftext|>, which doubles as padding.
    """
    text = config.get("text_config") or config
    eos = config.get("eos_token_id", text.get("eos_token_id", endoftext + 2))  # <|im_end|>
    stop = [*eos] if isinstance(eos, list) else [eos, endoftext]
    bos = config.get("bos_token_id", text.get("bos_token_id", endoftext))
    return {"bos_token_id": bos, "eos_token_id": stop, "pad_token_id": endoftext}


def write_model_files(out: Path, config: dict[str, Any]) -> None:
    """config.json, generation_config.json and the tokenizer files into ``out``."""
    vocab = vocab_for(config)
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation_config(config, vocab.num_ranks))
    write_tokenizer_files(out, vocab)
