"""Prompt tokenisation bounded in time and memory, with the context check as it goes.

Tokenising a 30 MB prompt whole took the server from 185 MB to 5.2 GB (the tokenizer
keeps offsets, strings and alignments per token and per byte) and ~45 s, only to
answer "too long". Here the text is encoded in pieces of about `CHUNK_CHARS`
characters, and encoding stops as soon as the count passes the limit, so the work and
memory are those of the limit plus one piece. A first check from the length alone
(`min_tokens`) refuses absurd sizes before any encoding.

Pieces are cut only where the tokenizer is known to cut anyway, so the ids are those
of a whole-text encode: before a letter that follows a newline, and before a space
between two letters (no pre-tokenizer pattern of the byte-level BPE families we serve,
Qwen, GPT-4/o200k and DeepSeek, spans those points, and Unicode normalisation never
composes across a newline or a space). This is checked on the loaded tokenizer at
start (`_cuts_are_exact`); a tokenizer that fails the check is encoded whole.

Text with no such point (megabytes of one "word") is one piece however long: ~1 s and
~60 MB of tokenizer state a MB. Such pieces are encoded one at a time in the process
(`_LONG_PIECE`), so a client sending many of them at once queues behind itself instead of
taking the host's memory from every other client; the encoder runs without the GIL
(`TokenizerBundle.encode`), so nobody else waits for it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
from typing import Any

from edgemoe.tokenizer import TokenizerBundle

CHUNK_CHARS = 1 << 18  # ~256 K characters: a few tens of MB of tokenizer state at most
_LONG_PIECE = threading.Lock()  # held while a piece past LONG_PIECE_CHUNKS chunks is encoded
LONG_PIECE_CHUNKS = 2  # a cut piece is at most about one chunk: longer ones had no cut point
# Normalisers that never shrink text by more than a factor (NFC composes at most four
# code points into one); with any other the length bound is not used.
_SAFE_NORMALIZERS = {"NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1}
# Text that must tokenise the same whole and cut at every allowed point (start check).
_PROBE = (
    "Hello world, it's a test.\nLine two\tand  three spaces\n\n  indented\nünïcödé e\u0301 Ωmega\n"
    "x = {'a': [1, 22, 333]}\n// comment\n/path/to\n!!\nword\r\nwin 12345 abc\n<|im_start|>user\nhi"
)


class TooManyTokens(ValueError):
    """The text has more than the allowed number of tokens (`count` so far; `exact` when
    `count` is the whole text's)."""

    def __init__(self, count: int, exact: bool) -> None:
        super().__init__(f"{'' if exact else 'at least '}{count} tokens")
        self.count = count
        self.exact = exact


class PromptTokenizer:
    """`encode`/`count` of prompt text, in pieces, stopping at a limit. Thread-safe."""

    def __init__(self, bundle: TokenizerBundle, chunk_chars: int = CHUNK_CHARS) -> None:
        self.bundle = bundle
        self.chunk_chars = chunk_chars
        self.chunked = _cuts_are_exact(bundle)

    @functools.cached_property
    def chars_per_token(self) -> int | None:
        # Reads the whole vocabulary (~0.2 s): only once a long text needs it.
        return _max_chars_per_token(self.bundle)

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens of `text`, from its length alone (0: none known)."""
        if len(text) <= self.chunk_chars or self.chars_per_token is None:
            return 0
        return -(-len(text) // self.chars_per_token)

    def encode(self, text: str, *, limit: int | None = None, add_special_tokens: bool = False) -> list[int]:
        """The ids of `text` (as `TokenizerBundle.encode`); raises TooManyTokens past `limit`."""
        if limit is not None and self.min_tokens(text) > limit:
            raise TooManyTokens(self.min_tokens(text), exact=False)
        ids: list[int] = []
        pieces = self.pieces(text)
        for i, piece in enumerate(pieces):
            ids.extend(self._encode_piece(piece, add_special_tokens and i == 0))
            if limit is not None and len(ids) > limit:
                raise TooManyTokens(len(ids), exact=i == len(pieces) - 1)
        return ids

    def count(self, text: str) -> int:
        """How many tokens `text` has, holding no more than a piece's ids at a time."""
        return sum(len(self._encode_piece(piece, False)) for piece in self.pieces(text))

    def _encode_piece(self, piece: str, add_special_tokens: bool) -> list[int]:
        """One piece's ids; a piece with no cut point in it waits for any other such piece."""
        long = len(piece) > LONG_PIECE_CHUNKS * self.chunk_chars
        with _LONG_PIECE if long else contextlib.nullcontext():
            return self.bundle.encode(piece, add_special_tokens=add_special_tokens)

    def pieces(self, text: str) -> list[str]:
        """`text` cut at allowed points into pieces of about `chunk_chars` (whole if it cannot be)."""
        if not self.chunked or len(text) <= self.chunk_chars:
            return [text]
        out, start = [], 0
        while len(text) - start > self.chunk_chars:
            cut = find_cut(text, start + self.chunk_chars)
            if cut < 0:
                break
            out.append(text[start:cut])
            start = cut
        out.append(text[start:])
        return out


# Candidates for a cut (checked with str.isalpha, the tokenizers' \p{L}): a letter after
# a newline, or a space between two letters. `[^\W\d_]` is a letter in Python's re.
_CUT = re.compile(r"(?<=\n)(?=[^\W\d_])|(?<=[^\W\d_]) (?=[^\W\d_])")


def find_cut(text: str, at: int) -> int:
    """The first allowed cut at or after `at` (-1: none): before a letter after a newline,
    or before a space between two letters."""
    pos = max(at, 1)
    while (m := _CUT.search(text, pos)) is not None:
        p = m.start()
        if text[p - 1] == "\n" and text[p].isalpha():
            return p
        if text[p] == " " and text[p - 1].isalpha() and p + 1 < len(text) and text[p + 1].isalpha():
            return p
        pos = p + 1
    return -1


def _cuts_are_exact(bundle: TokenizerBundle) -> bool:
    """Whether cutting at every allowed point of the probe text leaves its ids unchanged."""
    specials = [t.content for t in bundle.tokenizer.get_added_tokens_decoder().values()]
    if any(find_cut(s, 1) >= 0 or "\n" in s for s in specials):
        return False  # an added token could be cut in two
    whole = bundle.encode(_PROBE, add_special_tokens=False)
    tiny = PromptTokenizer.__new__(PromptTokenizer)
    tiny.bundle, tiny.chunk_chars, tiny.chunked = bundle, 1, True
    cut = [i for piece in tiny.pieces(_PROBE) for i in bundle.encode(piece, add_special_tokens=False)]
    return cut == whole and len(tiny.pieces(_PROBE)) > 5


def _max_chars_per_token(bundle: TokenizerBundle) -> int | None:
    """An upper bound on the text characters one token stands for, or None if unknown.

    Each vocabulary entry's length bounds its text: a byte-level token's string has one
    character per byte it writes (and a byte writes at most one character), pieces with
    markers (`▁the`, `##ing`, `<0x41>`) are no shorter than their text, added tokens are
    their text. Times what the normaliser may compose away.
    """
    normalizer = bundle.tokenizer.normalizer
    factor = _normalizer_factor(json.loads(normalizer.__getstate__()) if normalizer is not None else None)
    if factor is None:
        return None
    vocab = bundle.tokenizer.get_vocab(with_added_tokens=True)
    return max(1, max(map(len, vocab), default=1) * factor)


def _normalizer_factor(normalizer: Any) -> int | None:
    if normalizer is None:
        return 1
    if not isinstance(normalizer, dict):
        return None
    if normalizer.get("type") == "Sequence":
        factor = 1
        for part in normalizer.get("normalizers") or []:
            f = _normalizer_factor(part)
            if f is None:
                return None
            factor *= f
        return factor
    return _SAFE_NORMALIZERS.get(str(normalizer.get("type")))
