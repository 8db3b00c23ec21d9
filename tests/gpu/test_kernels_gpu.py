"""Triton kernels against their torch references on the GPU, bf16, at model shapes
(Qwen3-30B-A3B: H=2048, I=768, 128 experts, top-8, 32/4 heads x 128; Qwen3.5's 16/2 x 256),
plus odd head counts, page sizes, windows; CUDA-graph capture without host syncs; the fused
router (GEMV + softmax/top-k in one launch) against its reference, eager and captured."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from router_support import check_routing, logit_bound, planted, router_inputs  # noqa: E402

from edgemoe.kernels import moe_fused, norm_fused, paged_attention, rope_kv, router  # noqa: E402
from edgemoe.kernels.moe_experts import moe_combine  # noqa: E402
from edgemoe.kernels.moe_fused import moe_decode, moe_prefill, moe_slots_ref  # noqa: E402
from edgemoe.kernels.moe_reference import moe_combine_ref  # noqa: E402
from edgemoe.kernels.norm_fused import (  # noqa: E402
    add_rms_norm,
    add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from edgemoe.kernels.paged_attention import (  # noqa: E402
    decode_attention,
    decode_attention_ref,
    extend_attention,
    extend_attention_ref,
)
from edgemoe.kernels.rope_kv import rope_write_kv, rope_write_kv_ref  # noqa: E402
from edgemoe.quant.kv import KV_FP8, dequantise_kv  # noqa: E402
from edgemoe.testing.kernel_inputs import (  # noqa: E402
    MoEBatch,
    PagedBatch,
    head_norm_rope_bound,
    moe_batch,
    paged_batch,
    rope_bound,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
BF16 = torch.bfloat16
H, I, E, K = 2048, 768, 128, 8


@pytest.fixture(autouse=True)
def dispatch_must_pick_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dispatcher call here must take the Triton path (a silent fallback to the
    reference would compare the reference with itself)."""
    for module in (moe_fused, paged_attention, norm_fused, rope_kv, router):
        def strict(t: torch.Tensor, dtype: torch.dtype | None = None, _pick=module.use_triton) -> bool:  # noqa: ANN001
            assert _pick(t, dtype), "dispatcher fell back to the torch reference"
            return True

        monkeypatch.setattr(module, "use_triton", strict)


def moe_cells(kernel, b: MoEBatch, act: str = "silu") -> torch.Tensor:  # noqa: ANN001
    cells = torch.full((*b.slot_ids.shape, b.x.shape[1]), float("nan"), device=b.x.device)  # poisoned
    kernel(b.x, b.slot_ids, b.weights, b.gate_up, b.down, cells, act)
    return cells


def check_moe(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, slot_ids: torch.Tensor) -> None:
    skipped = (slot_ids < 0)[..., None].expand_as(got)
    assert got[skipped].isnan().all()  # -1 cells untouched
    assert not got[~skipped].isnan().any()
    # Each of the 4 roundings of the chain (projection, act, product, down) may land one
    # bf16 ulp (2^-7 relative) apart when fp32 sums run in another order: 4 * 2^-7 of the
    # cell's largest element.
    scale = want.nan_to_num().abs().amax(dim=-1, keepdim=True)
    assert ((got - want).nan_to_num().abs() <= 4 * 2**-7 * scale).all()
    # And as accurate as torch's bf16 path against the fp32 computation (x1.5 margin).
    err_kernel = (got - exact).nan_to_num().abs().max()
    err_torch = (want - exact).nan_to_num().abs().max()
    assert err_kernel <= 1.5 * err_torch + 1e-6


SPLIT4 = "16,128,4,16,128,4,4"  # EDGEMOE_MOE_GEMV_TILES: the default tiles, gate/up split 4 ways


@pytest.mark.parametrize("tokens", [1, 8, 32, 300])
@pytest.mark.parametrize("path", ["decode", "decode split-K 4", "prefill"])
def test_moe_matches_ref(path: str, tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "decode split-K 4":
        monkeypatch.setenv("EDGEMOE_MOE_GEMV_TILES", SPLIT4)
    b = moe_batch(tokens, K, H, I, E, BF16, "cuda", seed=tokens, unrouted=0.1)
    kernel = moe_prefill if path == "prefill" else moe_decode
    want = moe_cells(moe_slots_ref, b)
    exact = moe_cells(moe_slots_ref, MoEBatch(b.x.float(), b.slot_ids, b.weights, b.gate_up.float(), b.down.float()))
    check_moe(moe_cells(kernel, b), want, exact, b.slot_ids)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_moe_other_activations(act: str) -> None:
    b = moe_batch(40, 4, 512, 384, 16, BF16, "cuda", seed=3, unrouted=0.2)
    want = moe_cells(moe_slots_ref, b, act)
    exact = moe_cells(moe_slots_ref, MoEBatch(b.x.float(), b.slot_ids, b.weights, b.gate_up.float(), b.down.float()),
                      act)
    for kernel in (moe_decode, moe_prefill):
        check_moe(moe_cells(kernel, b, act), want, exact, b.slot_ids)


def test_moe_decode_split_k_graph_and_batch_invariance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split-K (S = 4) under a CUDA graph: the fp32 partials allocated inside the capture
    (no workspace passed, as the engine calls it), a replay on new routing equals an
    eager run, and a token's cells are bitwise the same alone as in the batch of 8."""
    monkeypatch.setenv("EDGEMOE_MOE_GEMV_TILES", SPLIT4)
    b = moe_batch(8, K, H, I, E, BF16, "cuda", seed=9)
    cells = torch.zeros(8, K, H, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moe_decode(b.x, b.slot_ids, b.weights, b.gate_up, b.down, cells, "silu")  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_decode(b.x, b.slot_ids, b.weights, b.gate_up, b.down, cells, "silu")
    b.slot_ids.copy_(torch.roll(b.slot_ids, 1, dims=0))  # new routing, same buffers
    graph.replay()
    torch.cuda.synchronize()
    eager = torch.zeros_like(cells)
    moe_decode(b.x, b.slot_ids, b.weights, b.gate_up, b.down, eager, "silu")
    assert torch.equal(cells, eager)
    alone = torch.zeros(1, K, H, device="cuda")
    moe_decode(b.x[5:6], b.slot_ids[5:6], b.weights[5:6], b.gate_up, b.down, alone, "silu")
    assert torch.equal(alone[0], eager[5])


def test_moe_prefill_8k_tokens() -> None:
    b = moe_batch(8192, K, H, I, E, BF16, "cuda", seed=5)
    want = moe_cells(moe_slots_ref, b)
    got = moe_cells(moe_prefill, b)
    assert ((got - want).abs() <= 4 * 2**-7 * want.abs().amax(dim=-1, keepdim=True)).all()


def test_moe_combine_bitwise() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    cells = torch.randn(77, K, H, generator=g, device="cuda")
    residual = torch.randn(77, H, generator=g, device="cuda").to(BF16)
    assert torch.equal(moe_combine(cells, BF16), moe_combine_ref(cells, BF16))
    assert torch.equal(moe_combine(cells, BF16, residual), residual + moe_combine_ref(cells, BF16))


def fp32_attention(b: PagedBatch, window: int | None, decode: bool) -> torch.Tensor:
    f = lambda t: t.float()  # noqa: E731
    scale = b.q.shape[-1] ** -0.5
    if decode:
        return decode_attention_ref(f(b.q), f(b.k_cache), f(b.v_cache), b.page_table, b.req_rows, b.seq_lens,
                                    b.page_size, scale, window, torch.empty(b.q.shape, device=b.q.device))
    return extend_attention_ref(f(b.q), f(b.k_cache), f(b.v_cache), b.page_table, b.req_rows, b.cu_seqlens_q,
                                b.seq_lens, b.page_size, scale, window, b.max_q_len)


def check_attention(got: torch.Tensor, b: PagedBatch, window: int | None, decode: bool) -> None:
    # Against fp32: the kernel rounds the probabilities to bf16 (<= 2^-9 relative each,
    # so <= 2^-9 max|v| on the weighted sum) and the output (<= 2^-9 |out|): 2^-7 max|v|.
    want = fp32_attention(b, window, decode)
    assert not got.isnan().any()
    assert (got.float() - want).abs().max() <= 2**-7 * b.v_cache.float().abs().max()


ATTN = [  # Hq, Hkv, D, page_size, window
    (32, 4, 128, 16, None),  # Qwen3-30B-A3B
    (16, 2, 256, 64, None),  # Qwen3.5 gated attention
    (6, 2, 128, 1, None),
    (5, 1, 64, 64, None),
    (32, 4, 128, 16, 128),  # sliding window (gpt-oss style)
]


@pytest.mark.parametrize(("hq", "hkv", "d", "page_size", "window"), ATTN)
def test_decode_attention(hq: int, hkv: int, d: int, page_size: int, window: int | None) -> None:
    lens = [1, 17, 512, 513, 1000, 4096, 8191, 20000]
    b = paged_batch(lens, [1] * len(lens), hq, hkv, d, page_size, BF16, "cuda", seed=d + hq)
    out = torch.full_like(b.q, float("nan"))
    decode_attention(b.q, b.k_cache, b.v_cache, b.page_table, b.req_rows, b.seq_lens, page_size, d**-0.5, window, out)
    check_attention(out, b, window, decode=True)


def test_decode_attention_32k_batch1() -> None:
    b = paged_batch([32768], [1], 32, 4, 128, 16, BF16, "cuda", seed=1)
    out = torch.full_like(b.q, float("nan"))
    decode_attention(b.q, b.k_cache, b.v_cache, b.page_table, b.req_rows, b.seq_lens, 16, 128**-0.5, None, out)
    check_attention(out, b, None, decode=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    """bf16 as its bit patterns (torch.equal on floats calls -0 and +0 equal)."""
    return t.view(torch.int16)


# The default tiles, and a software-pipelined set of the tile sweep's (kernels/attn_decode_tiles.py).
@pytest.mark.parametrize("tiles", ["", "128,32,4,7,32,2"], ids=["default", "pipelined"])
def test_decode_attention_graph_replays_with_new_lengths(tiles: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captured once, replayed with new context lengths and queries written in place: the
    grid and workspace do not depend on the context, so each replay equals an eager call
    on the new inputs bit for bit."""
    from edgemoe.kernels.attn_decode_tiles import ENV

    monkeypatch.setenv(ENV, tiles)  # empty: the defaults
    lens = [32768, 2000, 1, 300, 65, 7, 4097, 513]
    b = paged_batch(lens, [1] * len(lens), 32, 4, 128, 16, BF16, "cuda", seed=13)
    out = torch.empty_like(b.q)
    args = (b.q, b.k_cache, b.v_cache, b.page_table, b.req_rows, b.seq_lens, 16, 128**-0.5, None)  # written in place
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode_attention(*args, out)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(*args, out)
    g = torch.Generator(device="cuda").manual_seed(14)
    for new in ([30001, 1999, 1, 299, 64, 1, 4096, 512], [1, 2000, 1, 17, 65, 7, 1, 100], lens):
        b.seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        b.q.copy_(torch.randn(b.q.shape, generator=g, device="cuda").to(BF16))
        graph.replay()
        want = decode_attention(*args, torch.empty_like(b.q))
        assert torch.equal(bits(out), bits(want)), new
    check_attention(out, b, None, decode=True)


@pytest.mark.parametrize(("hq", "hkv", "d", "page_size", "window"), ATTN)
def test_extend_attention(hq: int, hkv: int, d: int, page_size: int, window: int | None) -> None:
    # A 1000-token chunk after a 2000-token cached prefix, a whole 1500-token prompt, one token.
    b = paged_batch([3000, 1500, 501], [1000, 1500, 1], hq, hkv, d, page_size, BF16, "cuda", seed=d + hq + 1)
    out = extend_attention(b.q, b.k_cache, b.v_cache, b.page_table, b.req_rows, b.cu_seqlens_q, b.seq_lens,
                           page_size, d**-0.5, window, b.max_q_len)
    check_attention(out, b, window, decode=False)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(4096, 2048), (512, 32, 128)])
def test_norms(offset: float, shape: tuple[int, ...]) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(shape, generator=g, device="cuda") * 4).to(BF16)
    residual = torch.randn(shape, generator=g, device="cuda").to(BF16)
    weight = (torch.randn(shape[-1], generator=g, device="cuda") * 0.2 + 1).to(BF16)
    normed, new_residual = add_rms_norm(x, residual, weight, 1e-6, offset)
    want_normed, want_residual = add_rms_norm_ref(x, residual, weight, 1e-6, offset)
    assert torch.equal(new_residual, want_residual)
    # fp32 sums of squares in another order move the normalised value by an fp32 ulp or
    # two; it is then rounded to bf16 twice (the cast, then × weight): at most 2 bf16
    # ulps (2 × 2^-7 relative) apart.
    assert ((normed.float() - want_normed.float()).abs() <= 2 * 2**-7 * want_normed.float().abs()).all()
    plain, want_plain = rms_norm(x, weight, 1e-6, offset), rms_norm_ref(x, weight, 1e-6, offset)
    assert ((plain.float() - want_plain.float()).abs() <= 2 * 2**-7 * want_plain.float().abs()).all()


# (token, kv head) programs: Qwen3-30B-A3B's 8 q heads a kv head, Qwen3-Next's 8 of D = 256
# with partial rotary, 5 under one kv head (padded to 8), 5 a kv head over 8 kv heads, one a
# kv head (16 kv-head tiles, one row live), and 7 q heads over 3 programs (3, 3, 1)
@pytest.mark.parametrize(("hq", "hkv", "d", "rotary_dim"), [(32, 4, 128, 128), (16, 2, 256, 64), (5, 1, 64, 64),
                                                          (40, 8, 128, 128), (16, 16, 64, 64), (7, 3, 128, 32)])
def test_rope_write_kv_matches_reference(hq: int, hkv: int, d: int, rotary_dim: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    T, P, slots = 4096, 40960, 8192
    q, k, v = (torch.randn(T, h, d, generator=g, device="cuda").to(BF16) for h in (hq, hkv, hkv))
    positions = torch.randint(0, P, (T,), generator=g, device="cuda")
    out_loc = torch.randperm(slots, generator=g, device="cuda")[:T]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    freqs = torch.arange(P, device="cuda").float()[:, None] * inv_freq
    cos, sin = freqs.cos(), freqs.sin()
    caches = [torch.full((slots, hkv, d), 3.0, dtype=BF16, device="cuda") for _ in range(4)]
    got = rope_write_kv(q, k, v, positions, cos, sin, caches[0], caches[1], out_loc)
    want = rope_write_kv_ref(q, k, v, positions, cos, sin, caches[2], caches[3], out_loc)
    assert torch.equal(caches[1], caches[3])  # v: a copy
    # q and k: x·cos and rotate(x)·sin and their sum are each rounded to bf16 (as torch's
    # ops do); a compiler that keeps a product in fp32 (an FMA) parts from that by those
    # roundings and its own of the sum: rope_bound, 3·2^-8 · (|x·cos| + |x'·sin|).
    for x, a, b in ((q, got, want), (k, caches[0][out_loc], caches[2][out_loc])):
        diff = (a.float() - b.float()).abs()
        assert (diff <= rope_bound(x, positions, cos, sin)).all(), diff.max()


@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_rope_write_kv_fuses_head_norms(cache: str) -> None:
    """Qwen3-30B-A3B's heads (32 q / 4 kv x 128), 4096 tokens, the per-head q/k RMSNorms
    fused into the rope + KV write, against the model's norms (`rms_norm_ref`) then the
    reference; the first tokens alone give the same rows bitwise (the grid depends on the heads
    only: a token's programs do not see T)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    T, P, slots, hq, hkv, d, eps = 4096, 40960, 8192, 32, 4, 128, 1e-6
    q, k, v = (torch.randn(T, h, d, generator=g, device="cuda").mul(3).add(0.5).to(BF16) for h in (hq, hkv, hkv))
    qw, kw = (torch.randn(d, generator=g, device="cuda").mul(0.3).add(1).to(BF16) for _ in range(2))
    positions = torch.randint(0, P, (T,), generator=g, device="cuda")
    out_loc = torch.randperm(slots, generator=g, device="cuda")[:T]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    freqs = torch.arange(P, device="cuda").float()[:, None] * inv_freq
    cos, sin = freqs.cos(), freqs.sin()

    def caches() -> tuple[torch.Tensor, ...]:
        if cache == "bf16":
            return tuple(torch.full((slots, hkv, d), 3.0, dtype=BF16, device="cuda") for _ in range(2)) + (None, None)
        kc, vc = (torch.zeros(slots, hkv, d, dtype=KV_FP8, device="cuda") for _ in range(2))
        return kc, vc, torch.ones(slots, hkv, device="cuda"), torch.ones(slots, hkv, device="cuda")

    got, want = caches(), caches()
    got_q = rope_write_kv(q, k, v, positions, cos, sin, got[0], got[1], out_loc, got[2], got[3], qw, kw, eps)
    qn, kn = rms_norm_ref(q, qw, eps), rms_norm_ref(k, kw, eps)
    want_q = rope_write_kv_ref(qn, kn, v, positions, cos, sin, want[0], want[1], out_loc, want[2], want[3])
    # The norm's fp32 sums of squares run in another order, then rotate: head_norm_rope_bound.
    assert ((got_q.float() - want_q.float()).abs() <= head_norm_rope_bound(qn, positions, cos, sin)).all()
    k_bound = head_norm_rope_bound(kn, positions, cos, sin)
    if cache == "bf16":
        assert torch.equal(got[1], want[1])  # v: a copy
        assert ((got[0][out_loc].float() - want[0][out_loc].float()).abs() <= k_bound).all()
    else:
        assert torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8)) and torch.equal(got[3], want[3])
        # k's e4m3 codes: one e4m3 rounding each side, <= 2^-4 of its (token, head) amax.
        deq = [dequantise_kv(c[0][out_loc], c[2][out_loc], torch.float32) for c in (got, want)]
        amax = sum(x.abs().amax(-1, keepdim=True) for x in deq)
        assert ((deq[0] - deq[1]).abs() <= k_bound + 2**-4 * (1 + 2**-20) * amax).all()
    alone = caches()
    n = 7
    first_q = rope_write_kv(q[:n], k[:n], v[:n], positions[:n], cos, sin, alone[0], alone[1], out_loc[:n],
                            alone[2], alone[3], qw, kw, eps)
    assert torch.equal(first_q, got_q[:n])
    for a, b in zip(alone, got, strict=True):
        if a is not None:
            rows = out_loc[:n]
            assert torch.equal(a[rows].view(torch.uint8) if a.dtype == KV_FP8 else a[rows],
                               b[rows].view(torch.uint8) if b.dtype == KV_FP8 else b[rows])


def test_decode_kernels_capture_in_a_graph_without_syncs() -> None:
    """moe_decode + combine + decode attention in one CUDA graph (capture fails on any
    host sync), and a replay after new routing / context lengths written in place
    equals an eager run on the new inputs."""
    b = moe_batch(8, K, H, I, E, BF16, "cuda", seed=7)
    a = paged_batch([300, 2000, 40, 7000, 1, 64, 65, 513], [1] * 8, 32, 4, 128, 16, BF16, "cuda", seed=8)
    cells = torch.zeros(8, K, H, device="cuda")
    attn_out = torch.empty_like(a.q)
    workspace = torch.empty(8 * K * I, dtype=BF16, device="cuda")
    holder: dict[str, torch.Tensor] = {}

    def step() -> None:
        moe_decode(b.x, b.slot_ids, b.weights, b.gate_up, b.down, cells, "silu", workspace)
        holder["h"] = moe_combine(cells, BF16, b.x)
        decode_attention(a.q, a.k_cache, a.v_cache, a.page_table, a.req_rows, a.seq_lens, 16, 0.088, None, attn_out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a host sync inside a capture fails the capture
        step()
    b.slot_ids.copy_(torch.roll(b.slot_ids, 1, dims=0))  # new routing, same buffers
    a.seq_lens.copy_(torch.tensor([301, 1999, 41, 6000, 2, 64, 66, 512], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    replay_h, replay_attn = holder["h"].clone(), attn_out.clone()
    step()
    assert torch.equal(replay_h, holder["h"]) and torch.equal(replay_attn, attn_out)


def test_moe_prefill_has_no_host_sync() -> None:
    b = moe_batch(1024, K, H, I, E, BF16, "cuda", seed=9)
    cells = torch.zeros(1024, K, H, device="cuda")
    moe_prefill(b.x, b.slot_ids, b.weights, b.gate_up, b.down, cells, "silu")  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe_prefill(b.x, b.slot_ids, b.weights, b.gate_up, b.down, cells, "silu")
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --- the fused router: GEMV + softmax/top-k in one launch ---------------------------------


@pytest.fixture
def one_rounding_reference() -> Iterator[None]:
    """torch lets cuBLAS reduce a bf16 GEMM's split-K partials in bf16; the reference's
    logits must be one rounding of an fp32 sum, as `logit_bound` assumes."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    yield
    matmul.allow_bf16_reduced_precision_reduction = before


def fused_route(x: torch.Tensor, w: torch.Tensor, ws: router.RouterWorkspace) -> tuple[torch.Tensor, torch.Tensor]:
    def no_projection(*_: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the router fell back to the projection + top-k")

    return router.route_logits_topk(x, w, K, True, BF16, ws, no_projection)


@pytest.mark.parametrize("tokens", [1, 7, 32])
def test_fused_router_matches_reference(tokens: int, one_rounding_reference: None) -> None:
    x, w = router_inputs(tokens, E, H, BF16, seed=tokens, device="cuda")
    ws = router.RouterWorkspace.allocate(E, x.device)
    ids, weights = fused_route(x, w, ws)
    ref = F.linear(x, w).float()
    assert ((ws.logits[:tokens] - ref).abs() <= logit_bound(x, w, ref)).all()
    check_routing(x, w, K, True, ids, weights)
    assert not ws.arrivals.any()


def test_fused_router_exact_logits_many_launches() -> None:
    """Planted exact logits at 32 tokens (2,048 programs racing to 32 counters), 50 launches
    back to back on one workspace: the reference's ids every time (a program routing
    before every block of its token landed would pick another expert)."""
    x, w, L = planted(32, E, H, seed=3, device="cuda")
    want_ids, want_w = router.route_topk_ref(L.to(BF16), K, True, BF16)
    ws = router.RouterWorkspace.allocate(E, x.device)
    runs = [fused_route(x, w, ws) for _ in range(50)]
    for ids, weights in runs:
        assert torch.equal(ids, want_ids)
        assert ((weights - want_w).abs() <= 2**-8 * want_w).all()  # another exp: a bf16 rounding
    assert torch.equal(ws.logits, L) and not ws.arrivals.any()


def test_fused_router_batch_invariant() -> None:
    """A token's ids and weights are the same bits alone or among 32 tokens."""
    x, w = router_inputs(32, E, H, BF16, seed=5, device="cuda")
    ws = router.RouterWorkspace.allocate(E, x.device)
    ids, weights = fused_route(x, w, ws)
    for i in (0, 13, 31):
        one_ids, one_w = fused_route(x[i : i + 1], w, ws)
        assert torch.equal(one_ids[0], ids[i]) and torch.equal(one_w[0], weights[i])


def test_fused_router_graph_two_layers() -> None:
    """Two layers' routers on one workspace, captured in a CUDA graph and replayed twice on
    new hidden states written in place: equal to eager runs on those states."""
    x, wa = router_inputs(8, E, H, BF16, seed=21, device="cuda")
    _, wb = router_inputs(8, E, H, BF16, seed=22, device="cuda")
    ws = router.RouterWorkspace.allocate(E, x.device)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def step() -> None:
        out["a"] = fused_route(x, wa, ws)
        out["b"] = fused_route(x, wb, ws)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (23, 24):
        x.copy_(router_inputs(8, E, H, BF16, seed=seed, device="cuda")[0])
        graph.replay()
        torch.cuda.synchronize()
        replayed = {k: (ids.clone(), w.clone()) for k, (ids, w) in out.items()}
        want_a, want_b = fused_route(x, wa, ws), fused_route(x, wb, ws)
        for got, want in ((replayed["a"], want_a), (replayed["b"], want_b)):
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert not torch.equal(want_a[0], want_b[0])
    assert not ws.arrivals.any()
