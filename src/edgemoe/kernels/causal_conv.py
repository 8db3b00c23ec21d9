"""Depthwise causal conv1d with a per-sequence state pool (the GDN layers' short conv over q|k|v).

y[t, c] = act(bias[c] + sum_j weight[c, j] * x[t - (K-1-j)·d, c]), where inputs before a
sequence's first token come from its conv state: the last (K-1)·d inputs it has seen (zeros
for a fresh sequence). Kernel K = 4 and SiLU in Qwen3-Next / Qwen3.5 (dilation d = 1);
Qwen3.8-Flash-Next's PLE conv is dilated (d = ngram_size = 3: a state of 9 inputs).

Contract shared by both forms:

- x is token-major [T, C] (the flat varlen batch); weight [C, K] (transformers' `conv1d.weight`
  [C, 1, K] squeezed); bias [C] or None.
- `conv_pool` [N, C, (K-1)·d] holds the last (K-1)·d inputs of each live sequence, oldest
  first (for d = 1 the same as transformers' conv cache without its first, never-read
  column); sequence b reads row `state_idx[b]` (zeros where `has_initial_state[b]` is False:
  the row is not read) and gets its last (K-1)·d inputs written back into the same row, in
  place, in the pool's dtype.
  NOTE: `state_idx` entries must be distinct.
- Accumulation and the activation run in fp32, one rounding to x's dtype at the end (the
  causal-conv1d CUDA kernels do the same; transformers' bf16 path rounds after the conv and
  again after SiLU, so bf16 results agree to bf16 rounding, fp32 results to fp32 rounding).

On CUDA (`use_triton`) the decode form is one Triton kernel (`triton_ops/causal_conv.py`),
bitwise equal to `causal_conv1d_update_ref`; the prefill form is the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.kernels.backend import use_triton

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the Triton kernel loads and stores


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"unsupported conv activation {activation!r} (silu or None)")


def causal_conv1d_varlen_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_pool: torch.Tensor,
    state_idx: torch.Tensor, cu_seqlens: torch.Tensor, *, has_initial_state: torch.Tensor | None = None,
    activation: str | None = "silu", dilation: int = 1,
) -> torch.Tensor:
    """Prefill form: B sequences back to back in x [T, C], `cu_seqlens` [B+1]. Returns [T, C].

    Each tap j reads, for token t at position p of sequence b, input q = p-(K-1-j)·d: from x
    when q ≥ 0, else from b's state column S+q (S = (K-1)·d). Gathers only, no host sync.
    """
    taps = weight.shape[1]
    history = (taps - 1) * dilation
    device = x.device
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    idx = state_idx.to(device=device, dtype=torch.long)
    batch_of = torch.repeat_interleave(torch.arange(idx.numel(), device=device), lens, output_size=x.shape[0])
    pos = torch.arange(x.shape[0], device=device) - cu[batch_of]  # [T] position in the sequence
    state = conv_pool.index_select(0, idx)  # [B, C, K-1]
    if has_initial_state is not None:
        state = torch.where(has_initial_state.to(device).view(-1, 1, 1), state, 0)
    # The sequence's own inputs extended on the left by its state: ext(b, p) for p ≥ -(K-1).
    def ext(src_pos: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:  # -> [len(src_pos), C]
        from_x = x[(cu[owner] + src_pos).clamp(min=0)]
        from_state = state[owner, :, (src_pos + history).clamp(min=0, max=history - 1)]
        return torch.where((src_pos >= 0)[:, None], from_x.to(state.dtype), from_state)

    acc = torch.zeros(x.shape, dtype=torch.float32, device=device)
    for j in range(taps):
        acc += weight[:, j].float() * ext(pos - (taps - 1 - j) * dilation, batch_of).float()
    if bias is not None:
        acc += bias.float()
    out = _activate(acc, activation).to(x.dtype)
    # New state: inputs at positions len-S .. len-1 of each sequence (some may still be state).
    last = lens[:, None] - history + torch.arange(history, device=device)  # [B, K-1]
    owners = torch.arange(idx.numel(), device=device)[:, None].expand_as(last)
    new_state = ext(last.reshape(-1), owners.reshape(-1)).view(idx.numel(), history, -1).transpose(1, 2)
    conv_pool.index_copy_(0, idx, new_state.to(conv_pool.dtype))
    return out


def causal_conv1d_update_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_pool: torch.Tensor,
    state_idx: torch.Tensor, *, has_initial_state: torch.Tensor | None = None, activation: str | None = "silu",
    dilation: int = 1,
) -> torch.Tensor:
    """Decode form: one token per sequence, x [B, C] -> [B, C]. A gather, a weighted sum over
    K taps and a scatter: no host sync, capturable in a CUDA graph."""
    idx = state_idx.to(device=x.device, dtype=torch.long)
    state = conv_pool.index_select(0, idx)  # [B, C, S]
    if has_initial_state is not None:
        state = torch.where(has_initial_state.view(-1, 1, 1), state, 0)
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [B, C, S + 1], oldest first
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    taps, newest = weight.shape[1], window.shape[-1] - 1
    for j in range(taps):  # NOTE: the prefill form's order: both forms agree bitwise
        acc += weight[:, j].float() * window[:, :, newest - (taps - 1 - j) * dilation].float()
    if bias is not None:
        acc += bias.float()
    conv_pool.index_copy_(0, idx, window[:, :, 1:].to(conv_pool.dtype))
    return _activate(acc, activation).to(x.dtype)


def causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_pool: torch.Tensor,
    state_idx: torch.Tensor, *, has_initial_state: torch.Tensor | None = None, activation: str | None = "silu",
    dilation: int = 1,
) -> torch.Tensor:
    """Same contract as `causal_conv1d_update_ref`, bitwise; one launch on CUDA (the reference
    launches ~30 small kernels)."""
    params = [weight, conv_pool] + ([] if bias is None else [bias])
    if not use_triton(x) or any(t.dtype not in KERNEL_DTYPES for t in params):
        return causal_conv1d_update_ref(x, weight, bias, conv_pool, state_idx, has_initial_state=has_initial_state,
                                        activation=activation, dilation=dilation)
    from edgemoe.kernels.triton_ops.causal_conv import causal_conv1d_update_triton

    return causal_conv1d_update_triton(x, weight, bias, conv_pool, state_idx, has_initial_state=has_initial_state,
                                       activation=activation, dilation=dilation)


causal_conv1d_varlen = causal_conv1d_varlen_ref
