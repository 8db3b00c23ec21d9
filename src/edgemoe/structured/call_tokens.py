"""What a tool-call constraint needs of the vocabulary, built once per vocabulary and
format: the call tags' ids, the all-whitespace tokens, and which plain tokens would spell
the opening tag out (the parser reads text, so a call opened that way would skip the
grammar). The tags: `<tool_call>` / `</tool_call>` (Hermes, Qwen3-Coder), or MiniMax-M2's
block, `<minimax:tool_call>` / `</minimax:tool_call>`; each must be one token."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgemoe.structured.constraint import LEAD_SPACE

OPEN_TEXT = b"<tool_call>"
CLOSE_TEXT = b"</tool_call>"
# Formats whose calls sit in other tags than Hermes' (the rest, where held, use Hermes').
_OTHER_TAGS = {"minimax_m2": (b"<minimax:tool_call>", b"</minimax:tool_call>")}
_SPACE = b" \t\n\r"  # JSON's whitespace (not bytes.strip()'s, which takes \x0b and \x0c too)


def tag_texts(tool_format: str) -> tuple[bytes, bytes]:
    """The opening and closing tags of `tool_format`'s calls (a MiniMax block's, else Hermes')."""
    return _OTHER_TAGS.get(tool_format, (OPEN_TEXT, CLOSE_TEXT))


@dataclass(frozen=True)
class CallTags:
    """The call tags' token ids (`<tool_call>` and `</tool_call>`, or another format's)."""

    open: int
    close: int


class SpaceTokens:
    """The vocabulary's all-whitespace tokens of at most LEAD_SPACE bytes, and their lengths."""

    def __init__(self, token_bytes: list[bytes | None]) -> None:
        spaces = [(t, len(b)) for t, b in enumerate(token_bytes)
                  if b and len(b) <= LEAD_SPACE and not b.strip(_SPACE)]
        self.ids = np.array([t for t, _ in spaces], dtype=np.int64)
        self.lengths = np.array([n for _, n in spaces], dtype=np.int64)
        self.length_of = dict(spaces)

    def within(self, room: int) -> np.ndarray:
        """The ids of whitespace tokens of at most `room` bytes."""
        return self.ids[self.lengths <= room]


class SpelledTag:
    """The opening `tag` written with plain tokens: `matched` bytes of it end the text so far
    (its longest prefix that does); `blocked(matched)` the tokens that would complete it."""

    def __init__(self, token_bytes: list[bytes | None], width: int, tag: bytes = OPEN_TEXT) -> None:
        self._bytes = token_bytes
        self._width = width
        self._tag = tag
        self._blocked: dict[int, np.ndarray | None] = {}

    def blocked(self, matched: int) -> np.ndarray | None:
        """bool [width], True for the tokens that would complete the tag; None: none would."""
        if matched not in self._blocked:
            head = self._tag[:matched]
            hits = [t for t, b in enumerate(self._bytes) if b and self._tag in head + b]
            out = None
            if hits:
                out = np.zeros(self._width, dtype=bool)
                out[hits] = True
            self._blocked[matched] = out
        return self._blocked[matched]

    def after(self, matched: int, token_id: int) -> int:
        """How much of the tag ends the text once `token_id` follows. A token without plain
        bytes (added or special) leaves it as it was: a special one is dropped from the
        text (`skip_special_tokens`), so `<tool` `<|box_start|>` `_call>` still spells it."""
        data = self._bytes[token_id] if 0 <= token_id < len(self._bytes) else None
        if not data:
            return matched
        text = self._tag[:matched] + data
        for n in range(min(len(text), len(self._tag) - 1), 0, -1):
            if text.endswith(self._tag[:n]):
                return n
        return 0


@dataclass(frozen=True)
class CallTokens:
    tags: CallTags
    spaces: SpaceTokens
    spelled: SpelledTag
