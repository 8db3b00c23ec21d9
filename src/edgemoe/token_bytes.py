"""Token ids → the exact bytes each token adds to the output.

A byte-level BPE token (Qwen, DeepSeek, GLM, gpt-oss) may hold part of a UTF-8
character, so its text alone is not decodable: the vocabulary entry is mapped back
through GPT-2's byte↔unicode table. Added tokens (`<|im_end|>`, `<think>`) are their
own text. Used by OpenAI logprobs (`server/logprobs.py`: a token's `bytes`) and by
structured outputs (`structured/vocab.py`: which tokens a grammar allows).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from edgemoe.assets.qwen3_tokenizer import bytes_to_unicode


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode` (printable stand-ins for every byte)."""
    return {ch: b for b, ch in bytes_to_unicode().items()}


class TokenBytes:
    """id → bytes for one tokenizer; `added` holds the added tokens' ids (`<|im_end|>`,
    `<think>`: control text, never part of what a grammar reads)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        self.added = frozenset(self._added)
        decoder = _decoder_config(tokenizer)
        self._byte_level = _has(decoder, "ByteLevel")
        # SentencePiece-style (Llama, Mistral): "▁" stands for a space, and a byte-fallback
        # piece `<0xE4>` is that one byte. Decoding such a token alone is wrong: the decoder
        # strips the leading space of the first token and turns a lone byte into U+FFFD.
        self._spaces = _space_pieces(decoder)
        self._byte_fallback = bool(getattr(tokenizer.model, "byte_fallback", False)) or _has(decoder, "ByteFallback")

    def __call__(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode()
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            table = unicode_to_byte()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        if self._byte_fallback and (m := _BYTE_PIECE.fullmatch(piece)):
            return bytes([int(m[1], 16)])
        if self._spaces:
            for mark, text in self._spaces.items():
                piece = piece.replace(mark, text)
            return piece.encode()
        return self._tok.decode([token_id], skip_special_tokens=False).encode()


def _decoder_config(tokenizer: Tokenizer) -> dict[str, Any]:
    # The decoder's own state is its JSON; far cheaper than serialising the whole tokenizer.
    decoder = tokenizer.decoder
    if decoder is None:
        return {}
    try:
        config = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _parts(decoder: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoder and, for a Sequence, its decoders (flattened)."""
    out = [decoder]
    for d in decoder.get("decoders") or []:
        if isinstance(d, dict):
            out += _parts(d)
    return out


def _has(decoder: dict[str, Any], kind: str) -> bool:
    return any(d.get("type") == kind for d in _parts(decoder))


def _space_pieces(decoder: dict[str, Any]) -> dict[str, str]:
    """Metaspace's replacement char, or a Replace decoder's string pattern, → its text."""
    out: dict[str, str] = {}
    for d in _parts(decoder):
        if d.get("type") == "Metaspace" and isinstance(d.get("replacement"), str):
            out[d["replacement"]] = " "
        elif d.get("type") == "Replace" and isinstance(d.get("pattern"), dict):
            mark, text = d["pattern"].get("String"), d.get("content")
            if isinstance(mark, str) and mark and isinstance(text, str):
                out[mark] = text
    return out
