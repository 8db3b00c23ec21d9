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

import functools
from collections import deque
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


class StopAutomaton:
    """Aho–Corasick automaton over a set of stop strings (immutable; shared by requests).

    `step(state, ch)` advances one character in O(1) amortised, however many stop strings
    there are; a state is the longest suffix of the text so far that is a prefix of some
    stop string (`depth[state]` characters), and `out[state]` the longest stop string
    ending right there (-1: none).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.goto: list[dict[str, int]] = [{}]  # per state: character → next state
        self.depth = [0]
        terminal = [-1]
        for index, stop in enumerate(stops):
            node = 0
            for ch in stop:
                nxt = self.goto[node].get(ch)
                if nxt is None:
                    nxt = len(self.depth)
                    self.goto[node][ch] = nxt
                    self.goto.append({})
                    self.depth.append(self.depth[node] + 1)
                    terminal.append(-1)
                node = nxt
            if terminal[node] < 0:
                terminal[node] = index
        self.fail, self.out = self._links(terminal)

    def _links(self, terminal: list[int]) -> tuple[list[int], list[int]]:
        """Failure links (breadth first) and each state's longest stop string ending there."""
        goto = self.goto
        fail, out = [0] * len(self.depth), list(terminal)
        queue = deque(goto[0].values())  # depth 1: fail to the root
        while queue:
            node = queue.popleft()
            for ch, nxt in goto[node].items():
                f = fail[node]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[nxt] = goto[f].get(ch, 0)
                if out[nxt] < 0:
                    out[nxt] = out[fail[nxt]]
                queue.append(nxt)
        return fail, out

    def step(self, state: int, ch: str) -> int:
        goto, fail = self.goto, self.fail
        while state and ch not in goto[state]:
            state = fail[state]
        return goto[state].get(ch, 0)


@functools.lru_cache(maxsize=8)
def stop_automaton(stops: tuple[str, ...]) -> StopAutomaton:
    """One automaton per distinct stop set: an agent sends the same stops every turn.

    NOTE: bounded memory: at most MAX_STOP_STRINGS × MAX_STOP_BYTES characters each.
    """
    return StopAutomaton(stops)


class StopChecker:
    """Cuts streamed text at the first stop string to complete.

    Feed it text pieces in order. It holds back the longest tail that is a proper
    prefix of a stop string (the match may complete in a later piece); on a match it
    returns the text before the match and `stopped=True`, and the stop string and all
    later text are dropped. Once stopped, every call returns `("", True)`.
    With overlapping stop strings the one whose occurrence ends first wins (ties: the
    longer one), e.g. stops ["a", "baa"] cut "baa" to "b": generation would have
    stopped at the "a" before "baa" could complete.

    Cost: O(1) amortised per character of new text (Aho–Corasick), independent of the
    number and length of the stop strings; the held-back tail is at most the longest
    stop string.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        stops = tuple(dict.fromkeys(s for s in stop if s))
        self._automaton = stop_automaton(stops) if stops else None
        self._state = 0
        self._held = ""
        self.matched: str | None = None  # the stop string that matched, for stop_reason

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def feed(self, text: str, armed: bool = True) -> StopResult:
        """Add the next piece of text; return what may be emitted now. Unless `armed`, a
        stop string ending in this piece does not stop (`min_tokens` not reached yet); one
        that begins here and ends in a later, armed piece does."""
        if self.stopped:
            return StopResult("", True)
        ac = self._automaton
        if ac is None:
            return StopResult(text, False)
        buf = self._held + text
        state, base = self._state, len(self._held)
        for i, ch in enumerate(text):
            state = ac.step(state, ch)
            if armed and ac.out[state] >= 0:
                # NOTE: the first position where any stop string ends: generation stops
                # there; of those ending here, `out` is the longest (the one starting first).
                self.matched = ac.stops[ac.out[state]]
                self._held = ""
                return StopResult(buf[: base + i + 1 - len(self.matched)], True)
        self._state = state
        keep = ac.depth[state]
        self._held = buf[len(buf) - keep :]
        return StopResult(buf[: len(buf) - keep], False)

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
        min_tokens: int = 0,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        self._stop = StopChecker(stop)
        # vLLM / SGLang semantics: no stop string ends within the first `min_tokens` tokens' text
        self._min_tokens, self._pushed = min_tokens, 0

    @classmethod
    def for_request(cls, tokenizer: TokenDecoder, params: SamplingParams) -> TextStream:
        return cls(tokenizer, stop=params.stop, skip_special_tokens=params.skip_special_tokens,
                   min_tokens=params.min_tokens)

    @property
    def _armed(self) -> bool:
        return self._pushed > self._min_tokens

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
        self._pushed += 1
        return TextDelta(*self._stop.feed(self._detok.push(token_id), self._armed))

    def finish(self) -> TextDelta:
        """Flush everything held back; a stop string may still match in the last text."""
        if self._stop.stopped:
            return TextDelta("", True)
        text, stopped = self._stop.feed(self._detok.flush(), self._armed)
        if stopped:
            return TextDelta(text, True)
        return TextDelta(text + self._stop.flush(), False)
