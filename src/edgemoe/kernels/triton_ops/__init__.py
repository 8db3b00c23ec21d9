"""Triton implementations of the ops in `edgemoe.kernels`.

Importing anything here imports Triton: only the dispatchers in `edgemoe.kernels.*`
(on CUDA tensors) and tests do, lazily. Every kernel also runs under Triton's
interpreter (`TRITON_INTERPRET=1`, CPU tensors), which is how CI checks their logic.
"""

from __future__ import annotations


def decode_step_kernels() -> list:
    """Every Triton kernel a decode step may launch (offload, the host embedding and
    `--dense-kernel triton` included): the kernels that take `USE_PDL` (docs/kernels.md)."""
    from edgemoe.kernels.triton_ops import (
        attn_decode,
        dense_gemv,
        moe_combine,
        moe_gemv,
        moe_gemv_q,
        norm,
        prefetch_marks,
        rope,
        router,
        row_gather,
        slot_plan,
    )

    return [
        norm._rms_norm, rope._rope_write_kv, attn_decode._decode_split, attn_decode._decode_merge,
        router._route_fused, router._route_topk, moe_gemv._gate_up_gemv, moe_gemv._down_gemv,
        moe_gemv_q._gate_up_gemv_q, moe_gemv_q._down_gemv_q, moe_combine._combine, moe_combine._combine_norm,
        slot_plan._plan_wave, row_gather._gather_rows, row_gather._gather_parts_into, dense_gemv._dense_gemv,
        prefetch_marks._prefetch_pins, prefetch_marks._prefetch_marks,
    ]
