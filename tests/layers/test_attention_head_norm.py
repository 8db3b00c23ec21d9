"""Qwen3's per-head q/k norms through the attention layer: the Triton backend fuses them
into its rope + KV-write kernel (run by Triton's interpreter on CPU), the torch backend
applies them as separate ops (the unfused path). A prefill step, then a decode step, on a
two-sequence paged batch: the queries attention sees, the cache and the layer's output
agree within rounding; an OffsetRMSNorm (not fused) gives bitwise the unfused q and cache."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
from tolerances import attention_atol, sum_atol

from edgemoe.cache.kv_pool import KVPool
from edgemoe.kernels import rope_kv
from edgemoe.kernels.dense_gemv import dense_gemv_ref
from edgemoe.layers.attention import Attention
from edgemoe.layers.attention_backend import AttentionBackend, AttentionSpec, RopeTable
from edgemoe.layers.batch import BatchHost, BatchMode, ForwardBatch
from edgemoe.layers.norm import OffsetRMSNorm, RMSNorm
from edgemoe.layers.rotary import RopeSpec, Rotary
from edgemoe.layers.torch_attention import TorchPagedAttention
from edgemoe.layers.triton_attention import TritonPagedAttention
from edgemoe.testing.kernel_inputs import head_norm_rope_bound

# conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")

H, HQ, HKV, D, R, PAGE, EPS = 48, 5, 1, 32, 16, 4, 1e-6  # odd head count, partial rotary
F32 = torch.float32
CPU = torch.device("cpu")


def paged(mode: BatchMode, q_lens: list[int], seq_lens: list[int]) -> ForwardBatch:
    """Sequences in page-table rows 2 and 0, their pages out of order."""
    rows, pages = [2, 0], [[5, 1], [3, 0]]
    table = torch.zeros(4, 2, dtype=torch.int32)
    for row, p in zip(rows, pages, strict=True):
        table[row] = torch.tensor(p, dtype=torch.int32)
    pos = torch.cat([torch.arange(n - q, n) for q, n in zip(q_lens, seq_lens, strict=True)])
    row_of = torch.cat([torch.full((q,), r) for q, r in zip(q_lens, rows, strict=True)])
    out_loc = table[row_of, pos // PAGE].long() * PAGE + pos % PAGE
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)
    host = BatchHost(tuple(q_lens), tuple(seq_lens), tuple(rows), len(q_lens) if mode is BatchMode.DECODE else 0)
    return ForwardBatch(mode, torch.zeros(len(pos), dtype=torch.long), pos, out_loc, i32(rows), i32(seq_lens), cu,
                        torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.int32), table, PAGE, host)


STEPS = [paged(BatchMode.PREFILL, [5, 3], [5, 3]), paged(BatchMode.DECODE, [1, 1], [6, 4])]


class Recorded:
    """Wraps a backend's `attend` to keep the queries it was given."""

    def __init__(self, backend: AttentionBackend) -> None:
        self.queries: list[torch.Tensor] = []
        attend = backend.attend

        def recording(spec: AttentionSpec, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
            self.queries.append(q.clone())
            return attend(spec, q, batch)

        backend.attend = recording  # type: ignore[method-assign]


def layer_inputs(norm: type[RMSNorm]) -> tuple[Attention, Rotary, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn((HQ + 2 * HKV) * D, H, generator=g) * H**-0.5 * 2  # projections ~ N(0, 4): off unit scale
    o_proj = torch.randn(H, HQ * D, generator=g) * (HQ * D) ** -0.5
    qw, kw = (torch.randn(D, generator=g) * 0.3 + 1 for _ in range(2))
    rotary = Rotary(RopeSpec(head_dim=D, theta=10000.0, rotary_dim=R), CPU)
    spec = AttentionSpec(0, HQ, HKV, D, D**-0.5, rope=RopeTable(*rotary.cos_sin_table(16)))
    layer = Attention(spec, qkv, o_proj, norm(qw, EPS), norm(kw, EPS), qk_norm="head")
    xs = [torch.randn(b.num_tokens, H, generator=g) for b in STEPS]
    return layer, rotary, xs


def run(layer: Attention, rotary: Rotary, xs: list[torch.Tensor], fused: bool, monkeypatch: pytest.MonkeyPatch):
    """(outputs, queries attention saw, pool) over the two steps."""
    pool = KVPool(1, 6, PAGE, HKV, D, F32, CPU)
    if fused:
        backend: AttentionBackend = TritonPagedAttention(pool, CPU)
        monkeypatch.setattr(rope_kv, "use_triton", lambda t, dtype=None: True)  # the kernel, interpreted
    else:
        backend = TorchPagedAttention(pool, CPU, kernel="ref")
    seen, outs = Recorded(backend), []
    for x, batch in zip(xs, STEPS, strict=True):
        backend.prepare(batch)
        cos, sin = rotary.cos_sin(batch.positions, F32) if backend.needs_step_rope else (None, None)
        outs.append(layer(x, cos, sin, batch, backend))
    monkeypatch.undo()
    return outs, seen.queries, pool


def output_bound(layer: Attention, q: torch.Tensor, dq: float, k: torch.Tensor, dk: float, v: torch.Tensor,
                 ctx_len: int) -> torch.Tensor:
    """How far the layer's outputs may part when its queries part by <= dq and the keys by
    <= dk: a score (scale · a sum of D products) moves by <= ds, which moves each softmax
    weight by a factor within e^±2ds, so the attention output by <= (e^2ds - 1)·max|v|;
    plus the two attention implementations' own rounding (attention_atol). o_proj then
    sums Hq·D products: Σ|W| times that, plus both products' rounding (sum_atol; the
    attention output, a convex combination of v rows, is <= max|v|)."""
    scale, qmax, kmax, vmax = D**-0.5, q.abs().max().item(), k.abs().max().item(), v.abs().max().item()
    ds = scale * D * (dq * kmax + (qmax + dq) * dk)
    attn = attention_atol(F32, D, ctx_len, vmax, scale * D * (qmax + dq) * (kmax + dk)) + math.expm1(2 * ds) * vmax
    w_sum = layer.o_proj.abs().sum(1)  # [H]
    return w_sum * attn + sum_atol(F32, HQ * D, w_sum.max().item() * (vmax + attn))


def test_fused_head_norms_match_the_unfused_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    layer, rotary, xs = layer_inputs(RMSNorm)
    want, want_q, want_pool = run(layer, rotary, xs, fused=False, monkeypatch=monkeypatch)
    got, got_q, got_pool = run(layer, rotary, xs, fused=True, monkeypatch=monkeypatch)
    assert layer.head_norms is not None and layer.head_norms.fusable
    table = layer.spec.rope
    assert table is not None
    for x, batch, out_w, out_g, q_w, q_g in zip(xs, STEPS, want, got, want_q, got_q, strict=True):
        q, k, _ = dense_gemv_ref(x, layer.qkv).split(layer.split, -1)
        qn = layer.q_norm(q.reshape(-1, HQ, D))  # type: ignore[misc]
        kn = layer.k_norm(k.reshape(-1, HKV, D))  # type: ignore[misc]
        loc, pos = batch.out_loc, batch.positions
        # the fused norm's fp32 sums of squares run in another order (head_norm_rope_bound)
        assert ((q_g - q_w).abs() <= head_norm_rope_bound(qn, pos, table.cos, table.sin)).all()
        k_diff = (got_pool.k[0][loc] - want_pool.k[0][loc]).abs()
        assert (k_diff <= head_norm_rope_bound(kn, pos, table.cos, table.sin)).all()
        assert torch.equal(got_pool.v[0], want_pool.v[0])  # v: never normalised
        bound = output_bound(layer, q_w, (q_g - q_w).abs().max().item(), want_pool.k[0],
                             (got_pool.k[0] - want_pool.k[0]).abs().max().item(), want_pool.v[0], max(batch.host.seq_lens))
        assert ((out_g - out_w).abs() <= bound).all()


def test_offset_norms_are_applied_before_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # Qwen3-Next's zero-centred x·(1 + w) norm is not fused: the backend applies it, then
    # rotates, and the rotation kernel is bitwise the reference's.
    layer, rotary, xs = layer_inputs(OffsetRMSNorm)
    assert layer.head_norms is not None and not layer.head_norms.fusable
    want, want_q, want_pool = run(layer, rotary, xs, fused=False, monkeypatch=monkeypatch)
    got, got_q, got_pool = run(layer, rotary, xs, fused=True, monkeypatch=monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(got_q, want_q, strict=True))
    assert torch.equal(got_pool.k, want_pool.k) and torch.equal(got_pool.v, want_pool.v)
    for batch, out_w, out_g, q_w in zip(STEPS, want, got, want_q, strict=True):  # only the attentions' rounding
        bound = output_bound(layer, q_w, 0.0, want_pool.k[0], 0.0, want_pool.v[0], max(batch.host.seq_lens))
        assert ((out_g - out_w).abs() <= bound).all()
