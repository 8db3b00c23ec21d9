"""The programmatic-dependent-launch switch (`backend.pdl_enabled`, docs/kernels.md): on
unless EDGEMOE_PDL=0, on a CUDA device of compute capability 9+ outside Triton's
interpreter; every decode-path kernel takes the `USE_PDL` constexpr (a launch that
omitted it would fail the interpreter tests); under the interpreter the switch stays off
even when asked for, so the kernels run there as before. The compiled instructions are
checked by tests/kernels/test_triton_compile.py (`--pdl`)."""

from __future__ import annotations

import importlib.util
import inspect
import os

import pytest
import torch

from edgemoe.kernels import backend
from edgemoe.kernels.backend import pdl_enabled
from edgemoe.kernels.triton_ops import decode_step_kernels

# tests/kernels/conftest.py sets TRITON_INTERPRET on a CPU-only machine when triton is importable. Not
# `from conftest import INTERPRET`: which conftest that finds depends on the collection order.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None

CUDA0 = torch.device("cuda", 0)  # a device object only: nothing touches a GPU here


@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A fake sm_90 device 0, Triton not interpreting, the switch unset."""
    monkeypatch.setattr(backend, "_capability", lambda index: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("EDGEMOE_PDL", raising=False)
    return monkeypatch


def test_on_by_default_on_hopper_off_with_zero(hopper: pytest.MonkeyPatch) -> None:
    assert pdl_enabled(CUDA0)
    hopper.setenv("EDGEMOE_PDL", "0")
    assert not pdl_enabled(CUDA0)
    hopper.setenv("EDGEMOE_PDL", "1")
    assert pdl_enabled(CUDA0)


def test_off_on_cpu_under_the_interpreter_and_before_hopper(hopper: pytest.MonkeyPatch) -> None:
    hopper.setenv("EDGEMOE_PDL", "1")
    assert not pdl_enabled(torch.device("cpu"))
    for value in ("1", "true", "on"):
        hopper.setenv("TRITON_INTERPRET", value)
        assert not pdl_enabled(CUDA0), value
    hopper.setenv("TRITON_INTERPRET", "0")
    assert pdl_enabled(CUDA0)
    for cap in ((8, 0), (8, 6), (8, 9)):
        hopper.setattr(backend, "_capability", lambda index, cap=cap: cap)
        assert not pdl_enabled(CUDA0), cap
    hopper.setattr(backend, "_capability", lambda index: (10, 0))  # Blackwell keeps griddepcontrol
    assert pdl_enabled(CUDA0)


@pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (CPU)")
def test_every_decode_kernel_takes_use_pdl_without_a_default() -> None:
    # No default: a launch that forgets the switch fails (the interpreter tests run every launch).
    for kernel in decode_step_kernels():
        param = inspect.signature(kernel.fn).parameters.get("USE_PDL")
        assert param is not None and param.default is inspect.Parameter.empty, kernel.fn.__name__


@pytest.mark.skipif(not INTERPRET, reason="needs Triton's interpreter (CPU)")
def test_kernels_run_in_the_interpreter_with_the_switch_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # EDGEMOE_PDL=1 on CPU tensors: the switch stays off, so `griddepcontrol` is never traced.
    from edgemoe.kernels.moe_reference import moe_combine_ref
    from edgemoe.kernels.norm_fused import add_rms_norm_ref
    from edgemoe.kernels.triton_ops.moe_combine import moe_combine_triton
    from edgemoe.kernels.triton_ops.norm import rms_norm_triton

    monkeypatch.setenv("EDGEMOE_PDL", "1")
    assert os.environ.get("TRITON_INTERPRET") == "1"
    g = torch.Generator().manual_seed(0)
    cells = torch.randn(3, 4, 64, generator=g)
    residual = torch.randn(3, 64, generator=g).bfloat16()
    assert torch.equal(moe_combine_triton(cells, torch.bfloat16, residual),
                       moe_combine_ref(cells, torch.bfloat16, residual))  # bitwise by construction
    x, w = torch.randn(3, 64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    normed, new_residual = rms_norm_triton(x, residual, w, 1e-6, 0.0)
    want_normed, want_residual = add_rms_norm_ref(x, residual, w, 1e-6, 0.0)
    assert torch.equal(new_residual, want_residual)  # the add is torch's bf16 add exactly
    # The fp32 rsqrt may differ from torch's by ulps, flipping one bf16 rounding: 2^-7 relative.
    assert ((normed.float() - want_normed.float()).abs() <= 2**-7 * want_normed.float().abs()).all()
