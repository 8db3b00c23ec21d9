"""Token ids -> text, incrementally, with stop strings. Torch-free (the server uses it too).

`IncrementalDetokenizer` decodes a small sliding window of recent tokens and emits only
the part of its text that can no longer change (vLLM's prefix/read offsets), so each
token costs O(1). `StopChecker` cuts the text at the first stop string, holding back any
tail that might be the start of one. `TextStream` chains the two for one request.

NOTE: the exactness contract is "concatenation of every emitted piece == one
`tokenizer.decode(all_ids)`". It holds for byte-level BPE decoders (Qwen, DeepSeek,
GLM, gpt-oss): their text is a UTF-8 decode of concatenated per-token bytes, which is
self-synchronising, so a window whose decoded text ends on a complete character can
be dropped without changing what comes after it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Sequence

from edgemoe.messages import SamplingParams

REPLACEMENT = "\ufffd"
# Pending tokens whose text still ends in U+FFFD before we try to cut the window
# elsewhere; only invalid byte soup or literal U+FFFD text runs that long.
MAX_PENDING = 8


class TokenDecoder(Protocol):
    """The part of `tokenizers.Tokenizer` used here (a Protocol so tests can wrap one)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def get_added_tokens_decoder(self) -> dict[int, Any]: ...


def special_token_ids(tokenizer: TokenDecoder) -> frozenset[int]:
    """Ids of added tokens flagged special: the ones `skip_special_tokens` drops."""
    return frozenset(i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special)


def _trailing_replacements(text: str) -> int:
    """How many U+FFFD end `text`: possibly an incomplete character still to be completed."""
    return len(text) - len(text.rstrip(REPLACEMENT))


class IncrementalDetokenizer:
    """Turns generated token ids into text, one token at a time.

    `push(id)` returns the text that became final with that token (often "", e.g. while
    a multi-byte character is split over tokens); `flush()` returns whatever is still
    held back (a trailing incomplete character decodes to U+FFFD, as in a full decode).
    `"".join(pushes) + flush() == tokenizer.decode(ids, skip_special_tokens=...)`.

    Only output ids are decoded, never the prompt: the contract is the decode of the
    output alone, and byte-level text does not depend on what came before anyway.
    """

    def __init__(self, tokenizer: TokenDecoder, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # Skipped specials are removed by decode() before its decoder runs, so dropping
        # them here is exact and keeps them out of the window.
        self._dropped = special_token_ids(tokenizer) if skip_special_tokens else frozenset()
        self._ids: list[int] = []  # the window: [context | pending]
        self._read = 0  # ids[:_read] are context, their text fully emitted
        self._context_text = ""  # decode(ids[:_read])
        self._emitted = 0  # chars of the pending text already emitted
        self._finished = False

    @property
    def window_size(self) -> int:
        """Tokens currently decoded per step (bounded; exposed for tests)."""
        return len(self._ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the newly final text."""
        if self._finished:
            raise RuntimeError("push() after flush()")
        if token_id in self._dropped:
            return ""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        start = len(self._context_text) + self._emitted
        held = _trailing_replacements(text)
        if held == 0:
            # Ends on a complete character: the pending tokens become the next context.
            out = text[start:]
            self._ids = self._ids[self._read :]
            self._read = len(self._ids)
            self._context_text = self._decode(self._ids)
            self._emitted = 0
            return out
        stable = len(text) - held
        out = text[start:stable] if stable > start else ""
        self._emitted += len(out)
        if len(self._ids) - self._read > MAX_PENDING:
            out += self._cut_before_last(text, start + len(out))
        return out

    def _cut_before_last(self, text: str, emitted_to: int) -> str:
        """Bound the window when text keeps ending in U+FFFD (invalid bytes, literal U+FFFD).

        Splitting before the last token is safe when decoding the two halves apart
        gives the same text as together and the tail is not empty: then no byte of the
        tail continues a character begun in the head (for UTF-8 that would merge
        replacement characters and change the text), so the head's text is final.
        """
        head = self._decode(self._ids[:-1])
        tail = self._decode(self._ids[-1:])
        if not tail or head + tail != text:
            return ""  # the last token continues a character; try again next token
        out = head[emitted_to:]
        self._ids = self._ids[-1:]
        self._read = 0
        self._context_text = ""
        self._emitted = max(0, emitted_to - len(head))
        return out

    def flush(self) -> str:
        """Return the held-back text (may end in U+FFFD). The stream is then finished."""
        if self._finished:
            return ""
        self._finished = True
        text = self._decode(self._ids)
        return text[len(self._context_text) + self._emitted :]


class StopResult(NamedTuple):
    text: str  # safe to show: contains no stop string, nor a possible start of one
    stopped: bool  # a stop string matched; `text` ends just before it


class StopChecker:
    """Cuts streamed text at the first stop string to complete.

    Feed it text pieces in order. It holds back the longest tail that is a proper
    prefix of a stop string (the match may complete in a later piece); on a match it
    returns the text before the match and `stopped=True`, and the stop string and all
    later text are dropped. Once stopped, every call returns `("", True)`.
    With overlapping stop strings the one whose occurrence ends first wins (ties: the
    longer one), e.g. stops ["a", "baa"] cut "baa" to "b": generation would have
    stopped at the "a" before "baa" could complete.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stop if s))
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.matched: str | None = None  # the stop string that matched, for stop_reason

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def feed(self, text: str) -> StopResult:
        """Add the next piece of text; return what may be emitted now."""
        if self.stopped:
            return StopResult("", True)
        if not self._stops:
            return StopResult(text, False)
        buf = self._held + text
        # NOTE: every match starts inside `buf`: a match starting earlier would have
        # made that earlier tail a proper prefix of a stop string, which we held back.
        # The match that completes first wins (generation would stop right there),
        # then the one starting first; this makes the cut independent of how the
        # text was split into pieces.
        hits = [(i + len(s), i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        if hits:
            _, cut, self.matched = min(hits)
            self._held = ""
            return StopResult(buf[:cut], True)
        keep = self._partial_match_len(buf)
        self._held = buf[len(buf) - keep :]
        return StopResult(buf[: len(buf) - keep], False)

    def _partial_match_len(self, buf: str) -> int:
        """Length of the longest tail of `buf` that is a proper prefix of a stop string."""
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def flush(self) -> str:
        """At the end of the stream: release held text (no stop string can complete now)."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out


class TextDelta(NamedTuple):
    text: str  # new text to send to the client
    stopped: bool  # a stop string matched: the request is finished


class TextStream:
    """One request's output text: incremental detokenization then stop strings.

    Used by the engine's output path and the server alike. `push(id)` per generated
    token, `finish()` once when generation ended for any other reason (EOS, length).
    Whether to push a stop/EOS token at all is the caller's choice (with
    `skip_special_tokens` a special EOS decodes to nothing anyway).
    """

    def __init__(
        self,
        tokenizer: TokenDecoder,
        *,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        self._stop = StopChecker(stop)

    @classmethod
    def for_request(cls, tokenizer: TokenDecoder, params: SamplingParams) -> TextStream:
        return cls(tokenizer, stop=params.stop, skip_special_tokens=params.skip_special_tokens)

    @property
    def stopped(self) -> bool:
        return self._stop.stopped

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stop.matched

    def push(self, token_id: int) -> TextDelta:
        if self._stop.stopped:
            return TextDelta("", True)
        return TextDelta(*self._stop.feed(self._detok.push(token_id)))

    def finish(self) -> TextDelta:
        """Flush everything held back; a stop string may still match in the last text."""
        if self._stop.stopped:
            return TextDelta("", True)
        text, stopped = self._stop.feed(self._detok.flush())
        if stopped:
            return TextDelta(text, True)
        return TextDelta(text + self._stop.flush(), False)
