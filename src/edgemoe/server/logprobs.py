"""Token ids → the token strings and bytes that OpenAI logprobs carry.

A byte-level BPE token may hold part of a UTF-8 character, so its text alone is not
decodable; OpenAI reports such tokens' exact `bytes` (`edgemoe.token_bytes`) and a
best-effort string.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from edgemoe.messages import TokenLogprob
from edgemoe.token_bytes import TokenBytes


class TokenTexts:
    """Cached token-id → (string, bytes) for logprob entries."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.token_bytes = lru_cache(maxsize=65536)(TokenBytes(tokenizer))

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
