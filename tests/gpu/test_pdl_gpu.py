"""Programmatic dependent launch (`EDGEMOE_PDL=1`, docs/kernels.md) on sm_90+: every
decode-path Triton kernel, chained as a decode step chains them (each reading what the
one before wrote) in one captured CUDA graph, gives bitwise the outputs of the same
graph captured with the switch off, replay after replay (a missing or late
`griddepcontrol.wait` shows as a kernel reading its input before its producer finished:
wrong or run-to-run varying values); and a small model's greedy tokens from CUDA graphs
are the same with the switch on and off, resident and with the device expert cache."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.dense_gemv import dense_gemv
from edgemoe.kernels.moe_experts import moe_combine, moe_combine_norm
from edgemoe.kernels.moe_fused import moe_decode
from edgemoe.kernels.moe_quant import moe_decode_quant
from edgemoe.kernels.norm_fused import add_rms_norm, rms_norm
from edgemoe.kernels.paged_attention import decode_attention
from edgemoe.kernels.prefetch_marks import prefetch_marks, prefetch_pins
from edgemoe.kernels.rope_kv import rope_write_kv
from edgemoe.kernels.router import (
    RouterWorkspace,
    add_norm_route,
    route_logits_topk,
    route_topk,
)
from edgemoe.kernels.row_gather import gather_rows, gather_rows_into
from edgemoe.kernels.slot_plan import plan_wave_fused
from edgemoe.kernels.triton_ops import (
    decode_step_kernels,
)
from edgemoe.layers.norm import RMSNorm
from edgemoe.moe.device_cache import DeviceSlotCache
from edgemoe.quant import expert_format, quantise_expert
from edgemoe.testing.kernel_inputs import paged_batch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0), reason="PDL needs sm_90+"
)

# A decode batch of 4 at small shapes: H = Hq·D; the router's N = 16 with K = 512 runs the
# dense GEMV with one-row programs (`dense_gemv_tiles.rows_for`); 12 slots for 16 experts: misses,
# hits and evictions in the device plan.
T, H, HQ, HKV, D, E, K, I, S, PAGE, VOCAB = 4, 512, 8, 2, 64, 16, 4, 128, 12, 16, 64
SEQ_LENS = [5, 40, 17, 63]
REPLAYS = 8
DT = torch.bfloat16


def build() -> SimpleNamespace:
    """Seeded inputs, weights and state (the same for every call)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(DT)

    pb = paged_batch(SEQ_LENS, [1] * T, HQ, HKV, D, PAGE, DT, device=dev, seed=3)
    pos = pb.seq_lens.long() - 1  # each sequence's new token is its last position
    rows = pb.page_table[pb.req_rows.long()]
    out_loc = (rows.gather(1, (pos // PAGE)[:, None])[:, 0].long() * PAGE + pos % PAGE).contiguous()
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D)
    ang = torch.arange(max(SEQ_LENS), device=dev, dtype=torch.float32)[:, None] * inv[None, :]
    cache = DeviceSlotCache(S, 1, E, dev, fused=True)
    state = cache.state
    gu_table, dn_table = rnd(E, 2 * I, H, scale=H**-0.5), rnd(E, H, I, scale=I**-0.5)
    fmt = expert_format("int8")
    experts = [quantise_expert(fmt, gu_table[e, :I].float(), gu_table[e, I:].float(), dn_table[e].float())
               for e in range(E)]
    b = SimpleNamespace(
        ids=torch.tensor([3, 17, 40, 9], device=dev), table=rnd(VOCAB, H), residual=rnd(T, H),
        norm_w=rnd(H, scale=0.1) + 1, norm2_w=rnd(H, scale=0.1) + 1, qkv_w=rnd((HQ + 2 * HKV) * D, H, scale=H**-0.5),
        o_w=rnd(H, HQ * D, scale=H**-0.5), router=rnd(E, H, scale=H**-0.5), qn=rnd(D, scale=0.1) + 1,
        kn=rnd(D, scale=0.1) + 1, pb=pb, positions=pos, out_loc=out_loc, cos=ang.cos(), sin=ang.sin(),
        ws=RouterWorkspace.allocate(E, dev), state=state, gu_table=gu_table.view(E, -1), dn_table=dn_table.view(E, -1),
        gu_slots=torch.zeros(S, 2 * I * H, dtype=DT, device=dev), dn_slots=torch.zeros(S, H * I, dtype=DT, device=dev),
        qparts={n: torch.stack([x[n] for x in experts]).to(dev) for n in experts[0]}, fmt=fmt,
        cells=torch.empty(T, K, H, dtype=torch.float32, device=dev),
        qcells=torch.empty(T, K, H, dtype=torch.float32, device=dev),
        attn_out=torch.empty(T, HQ, D, dtype=DT, device=dev),
        # decode prefetch's bookkeeping (moe/prefetch.py): pins, in-flight slots, loaded experts, counts
        pins=torch.zeros(S, dtype=torch.bool, device=dev), in_flight=torch.zeros(S, dtype=torch.bool, device=dev),
        loaded=torch.zeros(E, dtype=torch.bool, device=dev), used=torch.zeros((), dtype=torch.int64, device=dev),
        prefetched=torch.zeros((), dtype=torch.int64, device=dev),
    )
    # One earlier wave fills the pool, so the step's wave has hits, misses and evictions.
    warm = plan_wave_fused(state, 0, torch.arange(S, device=dev, dtype=torch.int32)[None, :], None, True, (1, 2))
    move_experts(b, warm.misses)
    b.snapshot = [t.clone() for t in mutable(b)]
    return b


def mutable(b: SimpleNamespace) -> tuple[torch.Tensor, ...]:
    """What a step writes in place (restored before each replay)."""
    return (*b.state, b.gu_slots, b.dn_slots, b.pb.k_cache, b.pb.v_cache, b.pins, b.in_flight, b.loaded, b.used,
            b.prefetched)


def move_experts(b: SimpleNamespace, misses: torch.Tensor) -> None:
    """The device mover: each missed expert's rows into its slot (-1 entries: nothing)."""
    gather_rows_into(b.gu_table, misses[0], b.gu_slots, misses[1])
    gather_rows_into(b.dn_table, misses[0], b.dn_slots, misses[1])


def restore(b: SimpleNamespace) -> None:
    for dst, src in zip(mutable(b), b.snapshot, strict=True):
        dst.copy_(src)


def step(b: SimpleNamespace) -> dict[str, torch.Tensor]:
    """Every decode-path kernel once, each consuming the one before's output."""
    out: dict[str, torch.Tensor] = {}
    x = out["embed"] = gather_rows(b.table, b.ids)  # row gather
    h, res = add_rms_norm(x, b.residual, b.norm_w, 1e-6)  # fused add + norm
    out["norm"], out["residual"] = h, res
    qkv = out["qkv"] = dense_gemv(h, b.qkv_w)  # dense decode GEMV
    q, k, v = qkv.view(T, HQ + 2 * HKV, D).split([HQ, HKV, HKV], dim=1)
    pb = b.pb
    q = out["q_rot"] = rope_write_kv(q, k, v, b.positions, b.cos, b.sin, pb.k_cache, pb.v_cache, b.out_loc,
                                     q_norm_w=b.qn, k_norm_w=b.kn)  # head norms + rope + KV write
    attn = out["attn"] = decode_attention(q, pb.k_cache, pb.v_cache, pb.page_table, pb.req_rows, pb.seq_lens, PAGE,
                                          D**-0.5, None, b.attn_out)  # split + merge
    o = out["o"] = dense_gemv(attn.view(T, HQ * D), b.o_w)
    h2, res2 = add_rms_norm(o, res, b.norm2_w, 1e-6)
    out["norm2"] = h2
    out["logits"] = dense_gemv(h2, b.router)  # one-row programs
    ids, w = route_logits_topk(h2, b.router, K, True, DT, b.ws)  # fused router
    out["ids"], out["weights"] = ids, w
    out["ids_topk"], out["weights_topk"] = route_topk(b.ws.logits[:T], K, True, DT)
    # the add + norm + router in one launch (`_route_fused` with NORM)
    out["nr_x"], out["nr_h"], out["nr_ids"], out["nr_w"] = add_norm_route(o, res, RMSNorm(b.norm2_w, 1e-6), b.router,
                                                                          K, True, DT, b.ws)
    plan = plan_wave_fused(b.state, 0, ids, None, True, (1, 2))  # the device cache's plan
    out["slot_ids"], out["misses"] = plan.slot_ids, plan.misses
    out["side_misses"] = torch.empty_like(plan.misses)  # the side stream's copy of the list
    prefetch_marks(plan.misses, out["side_misses"], b.in_flight, b.loaded, b.prefetched)  # as a prefetch
    prefetch_pins(plan.slot_ids, b.pins, ids, b.loaded, b.used)  # as the next layer's pins + precision count
    out |= {"pins": b.pins, "in_flight": b.in_flight, "loaded": b.loaded, "used": b.used, "prefetched": b.prefetched}
    move_experts(b, plan.misses)  # writes the slot banks the GEMVs read next
    b.cells.zero_()  # pairs the wave leaves out (-1) are not written
    moe_decode(h2, plan.slot_ids.view(T, K), w, b.gu_slots.view(S, 2 * I, H), b.dn_slots.view(S, H, I), b.cells,
               "silu")
    out["cells"] = b.cells
    b.qcells.zero_()
    moe_decode_quant(h2, ids, w, b.qparts, b.fmt, b.qcells, "silu")  # experts addressed by id
    out["qcells"] = b.qcells
    out["out"] = moe_combine(b.cells, DT, residual=res2)
    # the combine with the next layer's input norm fused (`_combine_norm`, what a decode step runs)
    out["cn_h"], out["cn_normed"] = moe_combine_norm(b.cells, DT, res2, RMSNorm(b.norm_w, 1e-6))
    out["final_norm"] = rms_norm(out["out"], b.norm_w, 1e-6)
    for name, t in (("k_cache", pb.k_cache), ("v_cache", pb.v_cache), ("gu_slots", b.gu_slots)):
        out[name] = t
    out |= {f"state{i}": t for i, t in enumerate(b.state)}
    return out


def graph_replays(monkeypatch: pytest.MonkeyPatch, flag: str) -> list[dict[str, torch.Tensor]]:
    monkeypatch.setenv("EDGEMOE_PDL", flag)
    assert pdl_enabled(torch.device("cuda")) == (flag == "1")
    b = build()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile off the graph
        step(b)
    torch.cuda.current_stream().wait_stream(side)
    restore(b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(b)
    runs = []
    for _ in range(REPLAYS):
        restore(b)
        graph.replay()
        torch.cuda.synchronize()
        runs.append({n: t.clone() for n, t in outs.items()})
    return runs




def launched_with_pdl(kernel) -> bool:  # noqa: ANN001 - a Triton JITFunction
    """Whether Triton compiled (so launched) a variant of `kernel` with launch_pdl (3.6's caches)."""
    compiled = kernel.device_caches[torch.cuda.current_device()][0].values()
    return any(c.metadata.launch_pdl for c in compiled)


def test_graph_replays_equal_with_pdl_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    off = graph_replays(monkeypatch, "0")
    on = graph_replays(monkeypatch, "1")
    missed = [k.__name__ for k in decode_step_kernels() if not launched_with_pdl(k)]
    assert not missed, f"never launched with PDL (a dispatcher took another path?): {missed}"
    unstable = sorted({n for r in off for n in r if not torch.equal(r[n], off[0][n])})
    assert not unstable, f"replays differ with EDGEMOE_PDL=0 (the reference itself): {unstable}"
    assert int((off[0]["slot_ids"] >= 0).sum()) > 0  # the wave computed pairs (the GEMVs ran on slots)
    for i, run in enumerate(on):
        bad = [n for n in run if not torch.equal(run[n], off[0][n])]
        assert not bad, f"replay {i}: {bad} differ with EDGEMOE_PDL=1"


PROMPTS = [list(range(2000, 2041)), [9707, 11, 1879, 0], list(range(40000, 40300, 3))]  # batch 3: padded to 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.mark.parametrize("settings", [
    dict(moe_backend="resident", dense_kernel="triton"),
    dict(moe_backend="offload", moe_slots=8, expert_cache="device"),  # qwen3_moe: no host embedding
], ids=["resident", "device-cache"])
def test_greedy_tokens_from_graphs_equal_with_pdl(small_ckpt, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                                 settings: dict) -> None:
    tokens = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("EDGEMOE_PDL", flag)
        with LLM(str(small_ckpt), dtype="bfloat16", device="cuda", **settings) as llm:
            assert llm.engine.runner.graphs is not None
            tokens[flag] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert tokens["1"] == tokens["0"]
