"""`--kv-cache-dtype fp8` through the engine on CPU: the plan counts e4m3 + scales, the pool
is fp8, and the model's logits equal those of the float-cache model whose KV writes store
dequantise(quantise(k, v)) instead — the same rounding, applied by the reference
quantiser on the float path (the kernels' own checks: tests/kernels/test_kv_fp8.py).
Tokens are not compared with the float cache: e4m3's 2^-4 rounding of keys and values
moves this random model's logits by up to a few units, more than some top-1 margins."""

from __future__ import annotations

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.engine.budget import kv_bytes_per_token
from edgemoe.layers import torch_attention
from edgemoe.quant.kv import KV_FP8, dequantise_kv, quantise_kv

SEQ = [9707, 11, 1879, 0, 64628, 109723, 113421, 147822, 2000, 2001, 2002]


def test_fp8_kv_cache_engine(qwen3_ckpt, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    with LLM(str(qwen3_ckpt), dtype="float32", kv_tokens=512, kv_cache_dtype="fp8") as llm:
        runtime = llm._engine().runtime
        assert runtime.pool.k.dtype == KV_FP8 and runtime.plan.kv_fp8
        assert runtime.plan.kv_bytes == 512 * kv_bytes_per_token(runtime.model.arch, "fp8")
        got = llm.prompt_logits(SEQ)
        tokens = llm.generate([SEQ[:4]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].token_ids
    write = torch_attention.write_kv_ref

    def fake_quantised(k_cache, v_cache, k, v, slots, k_scale=None, v_scale=None):  # noqa: ANN001, ANN202
        rounded = [dequantise_kv(*quantise_kv(t), t.dtype) for t in (k, v)]
        write(k_cache, v_cache, *rounded, slots)

    monkeypatch.setattr(torch_attention, "write_kv_ref", fake_quantised)
    with LLM(str(qwen3_ckpt), dtype="float32", kv_tokens=512) as llm:
        assert llm._engine().runtime.plan.kv_bytes == 512 * kv_bytes_per_token(llm._engine().runtime.model.arch)
        assert torch.equal(llm.prompt_logits(SEQ), got)  # dequantising in the read == storing dequantised values
        again = llm.generate([SEQ[:4]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].token_ids
    assert again == tokens
