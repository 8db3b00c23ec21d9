"""The checkpoint's tokenizer and chat template, loaded without torch or transformers.

Used by the server (tokenise prompts, render templates) and by the engine (eos ids,
vocabulary size). Everything comes from the files Hugging Face checkpoints ship:
`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, `config.json`,
`generation_config.json`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

log = logging.getLogger(__name__)

__all__ = ["TokenizerBundle"]


@dataclass(frozen=True)
class TokenizerBundle:
    """A loaded tokenizer plus the settings around it. Build with `TokenizerBundle.load`."""

    tokenizer: Tokenizer
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    add_bos_token: bool
    eos_token_ids: frozenset[int]
    special_token_ids: frozenset[int]
    chat_template: str | None
    # The file the chat template came from, so compile errors can name it.
    chat_template_path: Path | None

    @classmethod
    def load(cls, model_dir: Path) -> TokenizerBundle:
        """Load from a checkpoint directory. Raises ValueError naming any unreadable file."""
        model_dir = Path(model_dir)
        tok_cfg = _read_json(model_dir / "tokenizer_config.json")
        tokenizer = _parsed_tokenizer(model_dir, tok_cfg)
        bos, eos, pad = (_token_str(tok_cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token"))
        bos_id = tokenizer.token_to_id(bos) if bos is not None else None

        add_bos = tok_cfg.get("add_bos_token")
        if add_bos is not None and not isinstance(add_bos, bool):  # "no" would read as true
            raise ValueError(f"{model_dir / 'tokenizer_config.json'}: add_bos_token={add_bos!r}: expected true or false")
        if add_bos is None:
            # No explicit setting: transformers then relies on the post-processor, so do
            # what it would do (Llama-3's tokenizer.json adds BOS there).
            add_bos = bos_id is not None and tokenizer.encode("", add_special_tokens=True).ids[:1] == [bos_id]

        eos_ids = set(_eos_ids(model_dir / "config.json")) | set(_eos_ids(model_dir / "generation_config.json"))
        if eos is not None and (eos_id := tokenizer.token_to_id(eos)) is not None:
            eos_ids.add(eos_id)

        special = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
        special |= {i for t in (bos, eos, pad) if t is not None and (i := tokenizer.token_to_id(t)) is not None}

        template, template_path = _chat_template(model_dir, tok_cfg)
        return cls(
            tokenizer=tokenizer,
            bos_token=bos,
            eos_token=eos,
            pad_token=pad,
            add_bos_token=bool(add_bos),
            eos_token_ids=frozenset(eos_ids),
            special_token_ids=frozenset(special),
            chat_template=template,
            chat_template_path=template_path,
        )

    @property
    def bos_token_id(self) -> int | None:
        return self.tokenizer.token_to_id(self.bos_token) if self.bos_token is not None else None

    @property
    def pad_token_id(self) -> int | None:
        return self.tokenizer.token_to_id(self.pad_token) if self.pad_token is not None else None

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (the embedding may be padded larger)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenise `text` as it is; with `add_special_tokens`, prepend BOS if the config asks for it.

        NOTE: the tokenizer.json post-processor is never applied, so no EOS/SEP sneaks in, and
        a BOS already at the start of `text` (templates write `{{ bos_token }}`) is not doubled.
        """
        # NOTE: encode_batch runs without the GIL; encode holds it for the whole call, and a
        # server tokenises in a worker thread: a long prompt with no cut point (tens of MB of
        # one "word", ~20 s) froze the event loop and so every other client.
        ids = self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        bos_id = self.bos_token_id
        if add_special_tokens and self.add_bos_token and bos_id is not None and ids[:1] != [bos_id]:
            ids.insert(0, bos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


# Parsed tokenizers by content: parsing a 6 MB tokenizer.json takes ~0.4 s, and one process
# (the test suite, a server restarting its engine, an agent harness) loads the same
# tokenizer again and again from fresh checkpoint directories. Hashing the bytes costs
# a few ms. The Tokenizer is shared between bundles: nothing here mutates it after load
# (encode/decode take it read-only). A few entries only: a serving process holds one.
_PARSED: OrderedDict[bytes, Tokenizer] = OrderedDict()
_PARSED_LOCK = threading.Lock()
_PARSED_MAX = 4


def _parsed_tokenizer(model_dir: Path, tok_cfg: dict[str, Any]) -> Tokenizer:
    """tokenizer.json parsed, with the tokens tokenizer_config.json declares added; cached
    by the bytes of the one and the declarations of the other."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{path}: tokenizer file not found")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read tokenizer: {exc}") from exc
    declared = json.dumps(tok_cfg.get("added_tokens_decoder") or {}, sort_keys=True, default=str)
    key = hashlib.blake2b(data + b"\0" + declared.encode(), digest_size=20).digest()
    with _PARSED_LOCK:
        if (cached := _PARSED.get(key)) is not None:
            _PARSED.move_to_end(key)
            return cached
    tokenizer = _load_tokenizer(path, data)
    _add_declared_tokens(tokenizer, tok_cfg, model_dir / "tokenizer_config.json")
    with _PARSED_LOCK:
        _PARSED[key] = tokenizer
        while len(_PARSED) > _PARSED_MAX:
            _PARSED.popitem(last=False)
    return tokenizer


def _load_tokenizer(path: Path, data: bytes) -> Tokenizer:
    try:
        return Tokenizer.from_buffer(data)
    except Exception as exc:  # tokenizers raises a bare Exception for every parse error
        raise ValueError(f"{path}: cannot load tokenizer: {exc}") from exc


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; {} when the file is absent (all of these are optional)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_str(value: object) -> str | None:
    # Special tokens are saved either as plain strings or as serialised AddedTokens.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _eos_ids(path: Path) -> Iterable[int]:
    """eos_token_id from a (generation) config file: an int, a list, or nested in text_config.
    Anything else is said, not silently dropped: without its stop token a model runs to max_tokens."""
    config = _read_json(path)
    for cfg in (config, config.get("text_config") or {}):
        value = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
        values = value if isinstance(value, list) else [value]
        ids = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
        if value is not None and len(ids) != len(values):
            log.warning("%s: eos_token_id=%r: expected a token id or a list of them; using %s", path, value,
                        ids or "the tokenizer's eos_token alone")
        yield from ids


def _add_declared_tokens(tokenizer: Tokenizer, tok_cfg: dict[str, Any], cfg_path: Path) -> None:
    """Add tokens that tokenizer_config.json declares but tokenizer.json lacks (older checkpoints)."""
    declared = tok_cfg.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict) or not all(k.isdigit() for k in declared):
        raise ValueError(f"{cfg_path}: added_tokens_decoder must map token ids (\"151643\") to tokens")
    for id_str, tok in sorted(declared.items(), key=lambda kv: int(kv[0])):
        content = _token_str(tok)
        if not isinstance(tok, dict) or content is None or tokenizer.token_to_id(content) is not None:
            continue
        opts = {k: bool(tok[k]) for k in ("single_word", "lstrip", "rstrip", "normalized") if k in tok}
        added = AddedToken(content, special=bool(tok.get("special", False)), **opts)
        if added.special:
            tokenizer.add_special_tokens([added])
        else:
            tokenizer.add_tokens([added])
        if tokenizer.token_to_id(content) != int(id_str):
            # Ids are positional in tokenizers; a gap would shift every later id.
            raise ValueError(f"{cfg_path}: added token {content!r} declared as id {id_str} "
                             f"but the tokenizer assigns {tokenizer.token_to_id(content)}")


def _chat_template(model_dir: Path, tok_cfg: dict[str, Any]) -> tuple[str | None, Path | None]:
    """The chat template source and its file: chat_template.jinja wins over tokenizer_config."""
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.is_file():
        try:
            return jinja_path.read_text(encoding="utf-8"), jinja_path
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{jinja_path}: cannot read chat template: {exc}") from exc
    cfg_path = model_dir / "tokenizer_config.json"
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):
        # Named templates ({name, template}); the "default" one is the chat template.
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ValueError(f"{cfg_path}: chat_template list has no 'default' entry")
        template = named["default"]
    if template is None:
        return None, None
    if not isinstance(template, str):
        raise ValueError(f"{cfg_path}: chat_template must be a string or a list of {{name, template}}")
    return template, cfg_path
