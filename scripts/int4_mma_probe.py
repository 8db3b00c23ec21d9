"""A probe for the int4 decode GEMV on tensor cores (not the engine's kernel: an experiment
to measure on the GPU machine before anything of it goes into `triton_ops/moe_gemv_q.py`).

Why: at T = 1 the engine's int4 gate/up launch (`_gate_up_gemv_q`) runs at 0.7–0.9 TB/s,
bound by its arithmetic (sm_90 SASS: ~9 instructions a weight — unpack, the zero point, the
scale, the FMA — over few warps), where fp8's reads 2 TB/s. Here each GROUP-wide step turns
its codes into the exact integers (q − z) in bf16 (a bit-field, an OR and one subtraction
a weight: `dequant._nibble_codes` / `_biased`), and `tl.dot` multiplies them by the token's
activation, padded to 16 columns (column 0 real), so the multiply-adds run on the tensor
cores; each group's fp32 sums take the group's scale once per row. The products are exact
and each group's sum is fp32, so the result is the fp32 reference's to the order of its sums.

Two forms: `_gate_up_mma` unpacks as the engine does (`_nibble_codes`: codes in column
order, then one subtraction a weight) and dots each group whole; `_gate_up_mma_lop3` makes
two weights in three instructions (a shift, a `lop3` that puts nibbles s and s + 4 of a word
into the mantissas of 128.0 in bf16, a bf16x2 FMA that adds -(128 + z): inline PTX) and
dots each group as 8 slices of 16 columns against the activations of the same columns, so no
interleave. Both compile for sm_86/90 (mma.sync; wgmma at 64 rows on sm_90: checked with
scripts/triton_compile_check.py's `compile_case`, 2026-12-05); neither has run on a GPU.

The lop3 form's row loop (`_rows_lop3`) serves the down projection too (`_down_mma_lop3`).
Checks all three against `dequantise_expert` (the fp32 reference) at small shapes, then on a
GPU times them and the engine's two launches at Qwen3-30B-A3B's decode shape (128 experts,
H = 2048, I = 768, 8 pairs at T = 1, routes rotating past L2), each in a CUDA graph:
  run(command="source scripts/gpu_env.sh; OUT=$OUT python3 scripts/int4_mma_probe.py", carry=[".whl"])
Under Triton's interpreter the check needs tests/kernels/conftest.py's patch for numpy 2.4
(run it from a pytest test there); the interpreter's bf16 `tl.dot` reads bf16 bits as
integers, so under it both forms dot in fp32 (the same exact products), and the lop3 form's
PTX is replaced by plain ops: only the GPU run checks the PTX.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl

from edgemoe.kernels.triton_ops.dequant import _biased, _nibble_codes
from edgemoe.kernels.triton_ops.moe_common import slot_banks
from edgemoe.kernels.triton_ops.moe_gemv_q import gemv_bank
from edgemoe.quant import expert_format, quantise_expert
from edgemoe.quant.formats import dequantise_expert

N_PAD = 16  # the activation's columns in the dot (the MMA's narrowest); column 0 is the token


@triton.jit
def _gate_up_mma(x_ptr, slot_ptr, w_ptr, s_ptr, z_ptr, out_ptr, H, I, K, W_STORE, stride_xt, stride_ws, stride_wr,
                 stride_ss, stride_sr, stride_ot, BN: tl.constexpr, GROUP: tl.constexpr, N_PAD: tl.constexpr,
                 INTERP: tl.constexpr):
    """out[pair, :2I] = the gate and up rows of the pair's slot times its token's x, fp32."""
    pair = tl.program_id(0)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    t = pair // K
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok = rows < I
    bank, sbank, zbank = slot_banks(w_ptr, s_ptr, z_ptr, slot, stride_ws, stride_ss)
    col = tl.arange(0, N_PAD)
    acc_g = tl.zeros([BN, N_PAD], dtype=tl.float32)
    acc_u = tl.zeros([BN, N_PAD], dtype=tl.float32)
    for k0 in range(0, H, GROUP):
        k = k0 + tl.arange(0, GROUP)
        xv = tl.load(x_ptr + t * stride_xt + k, mask=k < H, other=0.0)
        xs = tl.where(col[None, :] == 0, xv[:, None], 0.0).to(tl.bfloat16)  # [GROUP, N_PAD]
        g = k0 // GROUP
        for half in tl.static_range(2):  # gate rows, then up rows
            r = rows + half * I
            r64 = r.to(tl.int64)
            code = _nibble_codes(bank, r64[:, None], row_ok, k0, W_STORE, stride_wr, GROUP, True)  # biased int32
            z = tl.load(zbank + r64 * stride_sr + g, mask=row_ok, other=0).to(tl.int32)
            s = tl.load(sbank + r64 * stride_sr + g, mask=row_ok, other=0.0).to(tl.float32)
            q = (code.to(tl.float32, bitcast=True) - _biased(z)[:, None]).to(tl.bfloat16)  # exact (q - z)
            if INTERP:  # the interpreter's bf16 dot reads the bits as integers: the same exact products in fp32
                part = tl.dot(q.to(tl.float32), xs.to(tl.float32), input_precision="ieee")
            else:
                part = tl.dot(q, xs)
            part = part * s[:, None]  # [BN, N_PAD]: column 0 the group's sums, scaled
            if half == 0:
                acc_g += part
            else:
                acc_u += part
    out_g = tl.sum(tl.where(col[None, :] == 0, acc_g, 0.0), axis=1)
    out_u = tl.sum(tl.where(col[None, :] == 0, acc_u, 0.0), axis=1)
    tl.store(out_ptr + pair * stride_ot + rows, out_g, mask=row_ok)
    tl.store(out_ptr + pair * stride_ot + I + rows, out_u, mask=row_ok)


@triton.jit
def _q_pairs(w, zneg, s: tl.constexpr, INTERP: tl.constexpr):
    """The exact integers (q - z) of nibbles s and s + 4 of each int32 word `w` (columns
    8j + s and 8j + s + 4 of the word j), as two bf16 tensors: one lop3 puts both nibbles into
    the mantissas of 128.0 (bf16 0x4300 | q = 128 + q), one bf16x2 FMA adds -(128 + z) (`zneg`:
    that bf16 in both halves) — two weights in three instructions, a shift included."""
    if INTERP:  # no inline PTX in the interpreter: the same values by plain ops
        z = (zneg & 0xFF).to(tl.float32)
        lo = (((w >> (4 * s)) & 0xF).to(tl.float32) - z).to(tl.bfloat16)
        hi = (((w >> (4 * s + 16)) & 0xF).to(tl.float32) - z).to(tl.bfloat16)
    else:
        lo, hi = tl.inline_asm_elementwise(
            """{
            .reg .b32 p, r, one;
            mov.b32 one, 0x3F803F80;
            lop3.b32 p, $2, 0x000F000F, 0x43004300, 0xea;
            fma.rn.bf16x2 r, p, one, $3;
            mov.b32 {$0, $1}, r;
            }""",
            "=h,=h,r,r", [w >> (4 * s), zneg], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
    return lo, hi


@triton.jit
def _x_cols(x_row, k0, s: tl.constexpr, C, N_PAD: tl.constexpr):
    """The dot's right operand [16, N_PAD] for the columns 8j + s (j = 0..15) of the group at
    k0 of the input row `x_row` (C long): column 0 those activations, the rest 0."""
    k = k0 + 8 * tl.arange(0, 16) + s
    xv = tl.load(x_row + k, mask=k < C, other=0.0)
    col = tl.arange(0, N_PAD)
    return tl.where(col[None, :] == 0, xv[:, None], 0.0).to(tl.bfloat16)


@triton.jit
def _rows_lop3(bank, sbank, zbank, r64, row_ok, x_row, C, W_STORE, stride_wr, stride_sr, BN: tl.constexpr,
               N_PAD: tl.constexpr, INTERP: tl.constexpr):
    """[BN] fp32: the bank's rows `r64` (int4, group 128 along C) times the input row `x_row`.
    Each group's 128 columns go to the dot as 8 slices of 16 (nibbles s and s + 4 of every
    word: `_q_pairs`), each against the activations of the same columns (`_x_cols`): no
    interleave; the group's fp32 sums take its scale once a row."""
    jw = tl.arange(0, 16)
    col = tl.arange(0, N_PAD)
    acc = tl.zeros([BN, N_PAD], dtype=tl.float32)
    for k0 in range(0, C, 128):
        g = k0 // 128
        words = tl.load(bank + r64[:, None] * stride_wr + (k0 // 8 + jw)[None, :],
                        mask=row_ok[:, None] & (k0 // 8 + jw < W_STORE)[None, :], other=0)
        z = tl.load(zbank + r64 * stride_sr + g, mask=row_ok, other=0).to(tl.int32)
        zb = 0xC300 | z  # bf16 bits of -(128 + z)
        zneg = (zb << 16) | zb
        sums = tl.zeros([BN, N_PAD], dtype=tl.float32)
        for s in tl.static_range(4):
            lo, hi = _q_pairs(words, zneg[:, None], s, INTERP)
            x_lo, x_hi = _x_cols(x_row, k0, s, C, N_PAD), _x_cols(x_row, k0, s + 4, C, N_PAD)
            if INTERP:  # the interpreter's bf16 dot reads bits as integers: the same exact products in fp32
                sums += tl.dot(lo.to(tl.float32), x_lo.to(tl.float32), input_precision="ieee")
                sums += tl.dot(hi.to(tl.float32), x_hi.to(tl.float32), input_precision="ieee")
            else:
                sums = tl.dot(lo, x_lo, sums)
                sums = tl.dot(hi, x_hi, sums)
        scale = tl.load(sbank + r64 * stride_sr + g, mask=row_ok, other=0.0).to(tl.float32)
        acc += sums * scale[:, None]
    return tl.sum(tl.where(col[None, :] == 0, acc, 0.0), axis=1)


@triton.jit
def _gate_up_mma_lop3(x_ptr, slot_ptr, w_ptr, s_ptr, z_ptr, out_ptr, H, I, K, W_STORE, stride_xt, stride_ws,
                      stride_wr, stride_ss, stride_sr, stride_ot, BN: tl.constexpr, N_PAD: tl.constexpr,
                      INTERP: tl.constexpr):
    """`_gate_up_mma` with `_rows_lop3`'s unpacking: the gate rows, then the up rows."""
    pair = tl.program_id(0)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok = rows < I
    bank, sbank, zbank = slot_banks(w_ptr, s_ptr, z_ptr, slot, stride_ws, stride_ss)
    x_row = x_ptr + (pair // K) * stride_xt
    for half in tl.static_range(2):
        r64 = (rows + half * I).to(tl.int64)
        out = _rows_lop3(bank, sbank, zbank, r64, row_ok, x_row, H, W_STORE, stride_wr, stride_sr, BN, N_PAD, INTERP)
        tl.store(out_ptr + pair * stride_ot + half * I + rows, out, mask=row_ok)


@triton.jit
def _down_mma_lop3(inter_ptr, slot_ptr, w_ptr, s_ptr, z_ptr, out_ptr, H, I, W_STORE, stride_it, stride_ws, stride_wr,
                   stride_ss, stride_sr, stride_ot, BN: tl.constexpr, N_PAD: tl.constexpr, INTERP: tl.constexpr):
    """out[pair, :H] = the pair's slot's down rows times its intermediate row (I long), fp32."""
    pair = tl.program_id(0)
    slot = tl.load(slot_ptr + pair)
    if slot < 0:
        return
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok = rows < H
    bank, sbank, zbank = slot_banks(w_ptr, s_ptr, z_ptr, slot, stride_ws, stride_ss)
    out = _rows_lop3(bank, sbank, zbank, rows.to(tl.int64), row_ok, inter_ptr + pair * stride_it, I, W_STORE,
                     stride_wr, stride_sr, BN, N_PAD, INTERP)
    tl.store(out_ptr + pair * stride_ot + rows, out, mask=row_ok)


def down_mma(inter: torch.Tensor, slots: torch.Tensor, parts: dict, hidden: int, bn: int = 16, warps: int = 4,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """[pairs, H] fp32: each pair's down rows times its row of `inter` [pairs, I] (bf16)."""
    b = gemv_bank(parts, "down", True)
    assert b.words and inter.shape[1] % 128 == 0, "int4 group 128, nibble rows of whole int32 words"
    if out is None:
        out = torch.zeros(slots.numel(), hidden, dtype=torch.float32, device=inter.device)
    _down_mma_lop3[(slots.numel(), triton.cdiv(hidden, bn))](
        inter, slots, b.data, b.scale, b.zero, out, hidden, inter.shape[1], b.row_len, inter.stride(0), *b.strides,
        out.stride(0), BN=bn, N_PAD=N_PAD, INTERP=os.environ.get("TRITON_INTERPRET") == "1", num_warps=warps)
    return out


def gate_up_mma(x: torch.Tensor, slots: torch.Tensor, parts: dict, inter: int, top_k: int, group: int,
                bn: int = 16, warps: int = 4, lop3: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """[pairs, 2I] fp32: each pair's gate and up rows (pairs = T * top_k, slots [pairs] int32);
    `lop3`: `_gate_up_mma_lop3` (group 128 only); `out`: where (a pair of slot -1 is not written)."""
    b = gemv_bank(parts, "gate_up", True)
    assert b.words, "nibble rows of whole int32 words"
    H = x.shape[1]
    assert H % group == 0 and group % 8 == 0 and (not lop3 or group == 128)
    if out is None:
        out = torch.zeros(slots.numel(), 2 * inter, dtype=torch.float32, device=x.device)
    grid = (slots.numel(), triton.cdiv(inter, bn))
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    args = (x, slots, b.data, b.scale, b.zero, out, H, inter, top_k, b.row_len, x.stride(0), *b.strides, out.stride(0))
    if lop3:
        _gate_up_mma_lop3[grid](*args, BN=bn, N_PAD=N_PAD, INTERP=interp, num_warps=warps)
    else:
        _gate_up_mma[grid](*args, BN=bn, GROUP=group, N_PAD=N_PAD, INTERP=interp, num_warps=warps)
    return out


def banks(E: int, H: int, inter: int, device: str, seed: int = 0) -> tuple[dict, list[tuple[torch.Tensor, ...]]]:
    """E random experts in int4 (group 128), stacked as slots, and each one's fp32 (gate_up, down)."""
    fmt = expert_format("int4")
    g = torch.Generator().manual_seed(seed)
    experts, refs = [], []
    for _ in range(E):
        gu, dn = torch.randn(2 * inter, H, generator=g) * H**-0.5, torch.randn(H, inter, generator=g) * inter**-0.5
        p = quantise_expert(fmt, gu[:inter], gu[inter:], dn)
        experts.append(p)
        refs.append(dequantise_expert(fmt, p, H, inter))
    parts = {n: torch.stack([p[n] for p in experts]).to(device) for n in experts[0]}
    return parts, refs


def check(device: str) -> float:
    """The probe against the fp32 reference at small shapes; returns the worst relative error."""
    E, H, inter, K, T = 6, 512, 256, 4, 3
    parts, refs = banks(E, H, inter, device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).to(device)
    inter_rows = torch.randn(T * K, inter, generator=g).to(torch.bfloat16).to(device)
    slots = torch.tensor([0, 5, -1, 2, 3, 1, 4, 0, 5, 2, -1, 1], dtype=torch.int32, device=device)
    outs = [(0, gate_up_mma(x, slots, parts, inter, K, 128, lop3=lop3).cpu(), x, K) for lop3 in (False, True)]
    outs.append((1, down_mma(inter_rows, slots, parts, H).cpu(), inter_rows, 1))
    worst = 0.0
    for proj, got, inputs, per_row in outs:
        for pair, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            want = refs[s][proj] @ inputs[pair // per_row].float().cpu()
            err = (got[pair] - want).abs().max() / want.abs().max()
            worst = max(worst, float(err))
    # fp32 sums of 512 exact products in another order: well under 1e-5 of the largest output
    assert worst < 1e-5, f"relative error {worst:.2e}"
    return worst


def time_graph(fn, reps: int = 50) -> float:  # noqa: ANN001
    """µs a call: `reps` calls captured in one CUDA graph, the replay timed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (5 * reps) * 1e6


def bench() -> dict:
    """Both gate/up launches at Qwen3-30B-A3B's decode shape, T = 1: 8 pairs, the routes
    rotating over 16 draws of the 128 experts (past L2)."""
    from edgemoe.kernels.triton_ops.moe_gemv_q import decode_q_launch, down_q_launch, gate_up_q_launch

    E, H, inter, K, group = 128, 2048, 768, 8, 128
    parts, _ = banks(E, H, inter, "cuda")
    fmt = expert_format("int4")
    g = torch.Generator().manual_seed(3)
    routes = [torch.randperm(E, generator=g)[:K].to(torch.int32).cuda().view(1, K) for _ in range(16)]
    x = torch.randn(1, H, generator=g).to(torch.bfloat16).cuda()
    w = torch.full((1, K), 1.0 / K, device="cuda")
    cells = torch.zeros(1, K, H, device="cuda")
    launches = [decode_q_launch(x, r, w, parts, fmt, cells, "silu") for r in routes]
    it = iter(range(1 << 30))
    engine_us = time_graph(lambda: gate_up_q_launch(launches[next(it) % 16]))
    it = iter(range(1 << 30))
    engine_down_us = time_graph(lambda: down_q_launch(launches[next(it) % 16]))
    it = iter(range(1 << 30))
    out = torch.zeros(K, 2 * inter, device="cuda")  # no memset inside the timed graph
    mma_us: dict[str, float] = {}
    for kind in ("plain", "lop3"):
        for bn, warps in ((16, 4), (32, 4), (64, 4), (32, 8), (64, 8)):
            try:
                mma_us[f"{kind} BN={bn} warps={warps}"] = time_graph(
                    lambda bn=bn, warps=warps, kind=kind: gate_up_mma(x, routes[next(it) % 16].view(-1), parts, inter,
                                                                      K, group, bn, warps, kind == "lop3", out))
            except Exception as e:  # noqa: BLE001 - a configuration that fails to build is reported, not fatal
                print(f"{kind} BN={bn} warps={warps}: {type(e).__name__}: {str(e)[:200]}")
    inter_rows = torch.randn(K, inter, generator=g).to(torch.bfloat16).cuda()
    cells_out = torch.zeros(K, H, device="cuda")
    down_us: dict[str, float] = {}
    for bn, warps in ((16, 4), (32, 4), (64, 4), (64, 8)):
        try:
            down_us[f"lop3 BN={bn} warps={warps}"] = time_graph(
                lambda bn=bn, warps=warps: down_mma(inter_rows, routes[next(it) % 16].view(-1), parts, H, bn, warps,
                                                    cells_out))
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            print(f"down BN={bn} warps={warps}: {type(e).__name__}: {str(e)[:200]}")
    gb = K * 2 * inter * H / 2 / 1e9  # the int4 bytes a gate/up call reads (scales aside); down: half
    result = {"engine_gate_up_us": engine_us, "mma_gate_up_us": mma_us, "engine_down_us": engine_down_us,
              "mma_down_us": down_us, "engine_gate_up_tb_s": gb / engine_us * 1e3,
              "mma_gate_up_tb_s": {k: gb / us * 1e3 for k, us in mma_us.items()},
              "engine_down_tb_s": gb / 2 / engine_down_us * 1e3,
              "mma_down_tb_s": {k: gb / 2 / us * 1e3 for k, us in down_us.items()}}
    print(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only the correctness check")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("int4_mma_probe.py: no GPU (on a CPU, call check('cpu') from a pytest test under "
                         "TRITON_INTERPRET=1: tests/kernels/conftest.py patches the interpreter for numpy 2.4)")
    print(f"int4 MMA probe: worst relative error {check('cuda'):.2e}")
    if args.check:
        return
    result = bench()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"int4-mma-probe-{time.strftime('%Y%m%d-%H%M%S')}.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
