"""`grammar_token_bytes` on a SentencePiece-style tokenizer (Llama / Mistral / Mixtral):
"▁" is a space wherever the token comes, and a byte-fallback piece `<0xE4>` is that one
byte (decoding the token alone strips the space and turns a lone byte into U+FFFD)."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from edgemoe.structured import Grammar
from edgemoe.structured.token_masks import TokenMasks
from edgemoe.structured.vocab import Vocabulary, grammar_token_bytes

PIECES = ["▁", "▁{", "{", '"', '▁"', "a", "▁b", "b", "}", "é"]


def _tokenizer(style: str) -> Tokenizer:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for p in PIECES:
        vocab[p] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    if style == "replace":  # Llama 2 / Mistral / Mixtral's tokenizer.json
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


@pytest.mark.parametrize("style", ["replace", "metaspace"])
def test_sentencepiece_token_bytes(style: str) -> None:
    tok = _tokenizer(style)
    got = grammar_token_bytes(tok)
    by_piece = {tok.id_to_token(i): b for i, b in enumerate(got)}
    assert by_piece["▁"] == b" " and by_piece["▁{"] == b" {" and by_piece["▁b"] == b" b"
    assert by_piece["<0x0A>"] == b"\n" and by_piece["<0xE4>"] == b"\xe4" and by_piece["é"] == "é".encode()
    assert got[:3] == [None, None, None]
    # In an enum ["ab"], "▁b" writes "a b": not allowed after "a.
    grammar = Grammar.from_schema({"enum": ["ab"]})
    masks = TokenMasks(grammar, Vocabulary(got, len(got)))
    allowed = masks.allowed(grammar.advance_bytes(grammar.start(), b'"a'))
    assert np.flatnonzero(allowed).tolist() == sorted([tok.token_to_id("b"), 3 + ord("b")])
