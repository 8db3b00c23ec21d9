"""Hashed n-gram ids of the per-layer embedding (PLE) tables of Qwen3.8-Flash-Next, over a
varlen batch (transformers' `Qwen4ExpTextNGramEmbedding`).

A sequence's token history is its previous `C = ngram_size - 1` tokens (its n-gram context:
EOS where the sequence starts) followed by this step's tokens. For a token t and shift s,
`shifted_s(t)` is the token s places back, unless an EOS lies in history[t-s .. t-1] (the
n-gram would cross a document boundary): then EOS. Per PLE layer j and n-gram order n
(2..N), `mixed = XOR_{s<n} shifted_s · mult_j[s]` in int64 (no overflow: the multipliers
are below 2^63 / vocab) and head i of order n reads row `(mixed mod vocab_ji) + offset_ji`
of layer j's table.

Two steps: `ngram_shifts` (the shifted tokens [N, T], and the sequences' new contexts
written back into their pool rows) and `ngram_ids` (the table rows [L, T, heads]). Device
ops only, no host sync: the engine hashes on the device for the device and host tables,
and the disk table's filler calls the same functions on host tensors.
"""

from __future__ import annotations

import torch


def ngram_shifts(
    input_ids: torch.Tensor,  # [T] the step's tokens, sequences back to back
    cu_seqlens: torch.Tensor,  # [B+1]
    ctx_pool: torch.Tensor,  # [R, C] int64: each sequence's previous C tokens, oldest first
    rows: torch.Tensor,  # [B] the sequences' rows of ctx_pool (distinct)
    has_initial_state: torch.Tensor,  # [B] bool: False = a fresh sequence (context all EOS, row unread)
    ngram_size: int,
    eos: int,
) -> torch.Tensor:
    """shifted [N, T] int64 (shift 0 = the tokens), and each sequence's last C history tokens
    written into its row of `ctx_pool`. NOTE: `rows` must be distinct (one row per sequence)."""
    C, device = ngram_size - 1, input_ids.device
    ids = input_ids.long()
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    idx = rows.to(device=device, dtype=torch.long)
    B, T = idx.numel(), ids.numel()
    owner = torch.repeat_interleave(torch.arange(B, device=device), lens, output_size=T)
    pos = torch.arange(T, device=device) - cu[owner]  # [T] position in the chunk
    ctx = ctx_pool.index_select(0, idx).long()  # [B, C]
    ctx = torch.where(has_initial_state.to(device).view(-1, 1), ctx, eos)

    def history(src: torch.Tensor, who: torch.Tensor) -> torch.Tensor:
        """The token at chunk position `src` (>= -C; negative: the context) of sequence `who`."""
        from_chunk = ids[(cu[who] + src).clamp(min=0, max=max(T - 1, 0))]
        from_ctx = ctx[who, (src + C).clamp(min=0, max=max(C - 1, 0))] if C else from_chunk
        return torch.where(src >= 0, from_chunk, from_ctx)

    shifted, crosses_eos = [ids], torch.zeros(T, dtype=torch.bool, device=device)
    for s in range(1, ngram_size):
        tok = history(pos - s, owner)
        crosses_eos = crosses_eos | (tok == eos)  # an EOS among tokens 1..s back
        shifted.append(torch.where(crosses_eos, eos, tok))
    if C:
        last = lens[:, None] - C + torch.arange(C, device=device)  # [B, C] history positions
        who = torch.arange(B, device=device)[:, None].expand_as(last)
        ctx_pool.index_copy_(0, idx, history(last.reshape(-1), who.reshape(-1)).view(B, C).to(ctx_pool.dtype))
    return torch.stack(shifted)


def ngram_ids(
    shifted: torch.Tensor,  # [N, T] int64 from ngram_shifts
    multipliers: torch.Tensor,  # [L, N] int64: each PLE layer's
    vocab_sizes: torch.Tensor,  # [L, heads] int64: each head's prime table size
    offsets: torch.Tensor,  # [L, heads] int64: each head's first row in its layer's table
    heads_per_ngram: int,
) -> torch.Tensor:
    """Table rows [L, T, heads] int64: heads (n-2)·h .. (n-1)·h - 1 hash the n-gram of order n."""
    blocks, mixed = [], shifted[0][None, :] * multipliers[:, :1]  # [L, T]
    for n in range(2, shifted.shape[0] + 1):
        mixed = torch.bitwise_xor(mixed, shifted[n - 1][None, :] * multipliers[:, n - 1 : n])
        heads = slice((n - 2) * heads_per_ngram, (n - 1) * heads_per_ngram)
        vocab, off = vocab_sizes[:, heads], offsets[:, heads]
        blocks.append(torch.remainder(mixed[:, :, None], vocab[:, None, :]) + off[:, None, :])
    return torch.cat(blocks, dim=-1)
