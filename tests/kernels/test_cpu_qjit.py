"""The AMX blocked path's int8 / fp8 tasks converting each k-step as the tiles go
(kernels/cpu/em_qjit.h, jobs of at most 32 padded tokens): every byte converted to its
exact bf16 value (e4m3's subnormals, signs and tails included), and the expert within
the error bound of exact weights — tighter than the scratch path's, whose weights carry
their scale rounded to bf16 — at odd sizes, fp8 blocks that cut rows and columns,
partial row groups and both token tiles. The amx-emu build runs it on CPUs without AMX."""

from __future__ import annotations

import ctypes

import pytest
import torch
from cpu_expert_support import error_bound, kernel_for, make_expert, rounds

from edgemoe.kernels import cpu_build, cpu_isa
from edgemoe.kernels.cpu_experts_quant import expert_mlp_q_cpu, expert_mlp_q_ref
from edgemoe.quant import Fp8Block, Int8Channel, dequantise_expert, quantise_expert

FORMATS = {"int8": Int8Channel(), "fp8": Fp8Block(block=32)}


def _hooked(variant: str):  # noqa: ANN202
    kernel_for(variant, "gemm")  # skips where the variant can't run
    lib = cpu_build.load_tuned(variant, "EM_TEST_HOOKS=1")
    lib.em_test_q_exact.restype = None
    lib.em_test_q_exact.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib


@pytest.mark.parametrize("variant", ["amx-emu", "amx"])
@pytest.mark.parametrize("length", [256, 45, 7])  # whole k-steps, a masked tail, a row shorter than one
def test_every_byte_converts_to_its_exact_bf16_value(variant: str, length: int) -> None:
    lib = _hooked(variant)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for fp8 in (1, 0):
        want = (codes.view(torch.float8_e4m3fn).float() if fp8 else codes.view(torch.int8).float())
        if fp8:  # e4m3fn's NaN bytes read as ±480 (kernels/cpu/em_quant.h; checkpoints hold none)
            want[codes == 0x7F], want[codes == 0xFF] = 480.0, -480.0
        want = want.bfloat16()
        assert torch.equal(want.float(), want.double().float()), "exact in bf16"
        for start in range(0, 256, length):
            row = codes[start:start + length].contiguous()
            out = torch.empty(len(row), dtype=torch.bfloat16)
            lib.em_test_q_exact(row.data_ptr(), len(row), fp8, out.data_ptr())
            assert torch.equal(out.view(torch.int16), want[start:start + length].view(torch.int16)), (fp8, start)


@pytest.mark.parametrize("variant", ["amx-emu", "amx"])
@pytest.mark.parametrize("fmt_name", list(FORMATS))
@pytest.mark.parametrize(("hidden", "inter"), [(67, 45), (160, 96), (96, 33)])
def test_converting_as_the_tiles_go_holds_the_exact_weights_bound(variant: str, fmt_name: str, hidden: int,
                                                                   inter: int) -> None:
    kernel = kernel_for(variant, "gemm")  # skips where the variant can't run
    fmt = FORMATS[fmt_name]
    gate_up, down = make_expert(hidden, inter, seed=hidden + inter)
    gate_up.view(-1)[::7] *= 1e-5  # e4m3 subnormals and zeros among the weights
    parts = quantise_expert(fmt, gate_up[:inter], gate_up[inter:], down)
    gate_up_q, down_q = dequantise_expert(fmt, parts, hidden, inter)
    g = torch.Generator().manual_seed(hidden)
    for tokens in (1, 5, 16, 17, 32):  # one token tile and two; 32 padded tokens at most
        for x_dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(tokens, hidden, generator=g).to(x_dtype)
            y, ref = expert_mlp_q_cpu(x, parts, fmt, kernel), expert_mlp_q_ref(x, parts, fmt)
            x_r, h_r, _ = rounds(variant, "gemm", x_dtype)
            excess = (y - ref).abs() - error_bound(x, gate_up_q, down_q, x_r, h_r, w_rounded=False)
            assert (excess <= 0).all(), f"{tokens} tokens: error exceeds the bound by {excess.max().item():.3g}"


def test_the_hooks_stay_out_of_the_default_build() -> None:
    variant = next((v for v in ("amx", "amx-emu") if cpu_isa.supported(v)), None)
    if variant is None or cpu_build.find_compiler() is None:
        pytest.skip("no AMX or emulated-AMX build here")
    assert not hasattr(kernel_for(variant, "gemm").lib, "em_test_q_exact")


def test_the_amx_probe_compiles_against_the_kernels_conversion(tmp_path) -> None:  # noqa: ANN001
    """scripts/amx_tile_probe.c (the GPU machine's `amx-probe` stage) includes the kernel's
    em_qexact.h: a change there must not break it unseen."""
    import subprocess
    from pathlib import Path

    cc = cpu_build.find_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    root = Path(__file__).resolve().parents[2]
    flags = [*cpu_build.VARIANT_CFLAGS["amx"], "-O1", f"-I{cpu_build.SOURCE_DIR}"]
    res = subprocess.run([cc, *flags, "-o", str(tmp_path / "probe"), str(root / "scripts" / "amx_tile_probe.c"),
                          "-lpthread"], capture_output=True, text=True, timeout=120)
    if res.returncode and "unrecognized" in res.stderr:
        pytest.skip(f"{cc} lacks the amx flags")
    assert res.returncode == 0, res.stderr[-2000:]
