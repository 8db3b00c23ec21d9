"""The n-gram hashing of Qwen3.8-Flash-Next's PLE against transformers' `Qwen4ExpTextNGramEmbedding`
(one whole sequence, no cache): the same table rows for random tokens with EOS segment
boundaries, computed one-shot, in chunks carrying the context row between them, and for
several sequences back to back in one varlen batch."""

from __future__ import annotations

import pytest
import torch

from edgemoe.kernels.ngram_hash import ngram_ids, ngram_shifts
from edgemoe.ple.geometry import ple_geometry

mod = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
EOS, VOCAB = 7, 50


def reference(ple_index: int, n: int = 3, per: int = 2):  # noqa: ANN201
    cfg = mod.Qwen4ExpTextConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4, ple_layer_ids=[1, 3], ple_embed_dim=8 * (n - 1) * per // 2,
        ngram_size=n, heads_per_ngram=per, ngram_vocab_size_base=97, eos_token_id=EOS, hc_count=2,
    )
    emb = mod.Qwen4ExpTextNGramEmbedding(cfg, cfg.ple_embed_dim, layer_idx=2 * ple_index, ple_layer_index=ple_index)
    with torch.no_grad():  # row r holds r: the embedding of an id is the id
        emb.ngram_embedding.weight.copy_(torch.arange(emb.ngram_embedding.weight.shape[0])[:, None].float())
    geometry = ple_geometry(ple_layers=(0, 2), vocab_size=VOCAB, ngram_size=n, heads_per_ngram=per,
                            embed_dim=cfg.ple_embed_dim, vocab_base=97, divisor=128, seed=1234, split_parts=512, eos=EOS)
    return emb, geometry


def ours(geometry, tokens: list[list[int]], chunks: int) -> list[torch.Tensor]:  # noqa: ANN001
    """Table rows [L, T_b, heads] per sequence, the sequences split into `chunks` steps."""
    g = geometry
    consts = [torch.tensor([getattr(x, f) for x in g.layers]) for f in ("multipliers", "vocab_sizes", "offsets")]
    ctx = torch.zeros((len(tokens), g.context), dtype=torch.int64)
    got: list[list[torch.Tensor]] = [[] for _ in tokens]
    bounds = [torch.linspace(0, len(t), chunks + 1).long().tolist() for t in tokens]
    for c in range(chunks):
        parts = [t[b[c] : b[c + 1]] for t, b in zip(tokens, bounds, strict=True)]
        lens = torch.tensor([len(p) for p in parts])
        cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).int()
        shifted = ngram_shifts(torch.tensor(sum(parts, [])), cu, ctx, torch.arange(len(tokens)).int(),
                               torch.tensor([b[c] > 0 for b in bounds]), g.ngram_size, g.eos)
        ids = ngram_ids(shifted, *consts, g.heads_per_ngram)
        for b in range(len(tokens)):
            got[b].append(ids[:, cu[b] : cu[b + 1]])
    return [torch.cat(parts, dim=1) for parts in got]


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_rows_equal_transformers(n: int, chunks: int) -> None:
    g = torch.Generator().manual_seed(n)
    tokens = [torch.randint(0, VOCAB, (L,), generator=g).tolist() for L in (1, 9, 23)]
    tokens[2][4] = tokens[2][11] = tokens[2][12] = EOS  # segment boundaries, one right after another
    for j in range(2):
        emb, geometry = reference(j, n)
        for seq, rows in zip(tokens, ours(geometry, tokens, chunks), strict=True):
            with torch.no_grad():
                want = emb(torch.tensor([seq]), cache=None)[0]  # [T, heads · d]: the ids, d times each
            d = geometry.head_dim
            assert torch.equal(rows[j], want[:, ::d].long()), (n, chunks, j)
