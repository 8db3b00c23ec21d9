"""Token ids → the token strings and bytes that OpenAI logprobs carry.

A byte-level BPE token (Qwen, DeepSeek, GLM, gpt-oss) may hold part of a UTF-8
character, so its text alone is not decodable; OpenAI reports such tokens' exact
`bytes` and a best-effort string. We map the vocabulary entry back through GPT-2's
byte↔unicode table; added tokens (`<|im_end|>`, `<think>`) are their own text.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from edgemoe.messages import TokenLogprob


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode` (printable stand-ins for every byte)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


class TokenTexts:
    """Cached token-id → (string, bytes) for logprob entries."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        self._byte_level = _uses_byte_level(_decoder_config(tokenizer))
        self.token_bytes = lru_cache(maxsize=65536)(self._token_bytes)

    def _token_bytes(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode()
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            table = _unicode_to_byte()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        return self._tok.decode([token_id], skip_special_tokens=False).encode()

    def text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    # -- OpenAI shapes ----------------------------------------------------------------

    def chat_entry(self, lp: TokenLogprob, top_n: int) -> dict[str, Any]:
        """One `choices[].logprobs.content[]` item of Chat Completions."""
        return {
            **self._token_fields(lp.token_id, lp.logprob),
            "top_logprobs": [self._token_fields(tid, value) for tid, value in lp.top[:top_n]],
        }

    def _token_fields(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.token_bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": _finite(logprob), "bytes": list(raw)}

    def completion_logprobs(self, entries: list[TokenLogprob], top_n: int, offset: int) -> dict[str, Any]:
        """The legacy Completions `logprobs` object; `offset`: text length before the first token."""
        tokens = [self.text(lp.token_id) for lp in entries]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(lp.logprob) for lp in entries],
            "top_logprobs": [{self.text(t): _finite(v) for t, v in lp.top[:top_n]} for lp in entries],
            "text_offset": offsets,
        }


def _finite(value: float) -> float:
    # JSON has no -inf; a token the filters ruled out gets OpenAI's floor instead.
    return value if value > -9999.0 else -9999.0


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


def _uses_byte_level(decoder: dict[str, Any]) -> bool:
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_uses_byte_level(d) for d in decoder.get("decoders") or [] if isinstance(d, dict))
