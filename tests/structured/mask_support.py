"""The token masks' reference, shared by the structured tests: Qwen3's real 151K
vocabulary (built once per session: every test module imports it from here), and the
plain definition of a mask, each token's bytes fed to the grammar one by one."""

from __future__ import annotations

import bisect
from functools import cache

import numpy as np
from tokenizers import Tokenizer

from edgemoe.assets.qwen3_tokenizer import qwen3_tokenizer_json
from edgemoe.structured import Grammar
from edgemoe.structured.constraint import PaddedValue
from edgemoe.structured.token_masks import TokenMasks
from edgemoe.structured.vocab import Vocabulary, grammar_token_bytes


@cache
def qwen_vocab() -> tuple[list[bytes | None], Vocabulary]:
    token_bytes = grammar_token_bytes(Tokenizer.from_file(str(qwen3_tokenizer_json())))
    return token_bytes, Vocabulary(token_bytes, len(token_bytes) + 7)  # wider logits than the tokenizer


_SORTED: dict[int, tuple[list[bytes | None], tuple[list[bytes], list[int], list[int], list[bytes]]]] = {}


def _in_byte_order(token_bytes: list[bytes | None]) -> tuple[list[bytes], list[int], list[int], list[bytes]]:
    """The tokens' bytes in byte order, their ids, how many leading bytes each shares with
    the one before it, and the bytes after those."""
    kept = _SORTED.get(id(token_bytes))
    if kept is None or kept[0] is not token_bytes:
        pairs = sorted((data, t) for t, data in enumerate(token_bytes) if data)
        datas, shared, prev = [d for d, _ in pairs], [], b""
        for data in datas:
            n, m = 0, min(len(prev), len(data))
            while n < m and prev[n] == data[n]:
                n += 1
            shared.append(n)
            prev = data
        rests = [data[n:] for data, n in zip(datas, shared, strict=True)]
        kept = _SORTED[id(token_bytes)] = (token_bytes, (datas, [t for _, t in pairs], shared, rests))
    return kept[1]


def brute_force(grammar: object, state: object, token_bytes: list[bytes | None], width: int) -> np.ndarray:
    """Each token's bytes fed one by one from `state`. `advance` is a function of (state,
    byte), so the state after a prefix is the same for every token that starts with it:
    in byte order a token takes the previous one's states along their shared prefix, and
    once a prefix is refused every token that starts with it is (the same answers as
    feeding each token from `state` on its own, without redoing shared prefixes)."""
    advance = grammar.advance  # type: ignore[attr-defined]
    datas, ids, shared, rests = _in_byte_order(token_bytes)
    states: list[object] = [state]  # states[k]: after the current token's first k bytes
    allowed: list[int] = []
    i = 0
    while i < len(datas):
        del states[shared[i] + 1:]  # the previous token's states along the shared prefix
        s = states[-1]
        for b in rests[i]:
            s = advance(s, b)
            if s is None:
                break
            states.append(s)
        else:
            allowed.append(ids[i])
            i += 1
            continue
        d = len(states)  # datas[i][:d] is refused: so is every token after it that starts with it
        i = bisect.bisect_right(datas, datas[i][:d], lo=i + 1, key=lambda x: x[:d])  # noqa: B023
    want = np.zeros(width, dtype=bool)
    want[allowed] = True
    return want


def states_checked_along(schema: object, text: str) -> list[object]:
    """Every state along `text` (after the leading-space wrapper's start), each state's
    mask checked against brute force; returns the states."""
    token_bytes, vocab = qwen_vocab()
    lead = PaddedValue(Grammar.from_schema(schema))
    masks = TokenMasks(lead, vocab)
    state, states = lead.start(), []
    for b in text.encode():
        state = lead.advance(state, b)
        assert state is not None
        assert np.array_equal(masks.allowed(state), brute_force(lead, state, token_bytes, vocab.width)), text
        states.append(state)
    return states
