"""Profile decode steps (batch 1) of a mid-size random Qwen3-MoE on the GPU: where
does a step's time go? Run on the GPU machine after scripts/gpu_bench.sh's setup."""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from edgemoe import LLM, SamplingParams
from edgemoe.testing import make_checkpoint

path = make_checkpoint("qwen3_moe", "/tmp/medium", hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                       num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8,
                       moe_intermediate_size=512, max_position_embeddings=8192)
backend = sys.argv[1] if len(sys.argv) > 1 else "resident"
with LLM(str(path), moe_backend=backend, **({"moe_slots": 128} if backend != "resident" else {})) as llm:
    p = SamplingParams(temperature=0, max_tokens=65, ignore_eos=True)
    llm.generate([[1000] * 512], SamplingParams(temperature=0, max_tokens=4))
    torch.cuda.synchronize()
    t = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    llm.generate([[1000] * 512], p)
    prof.disable()
    print(f"{backend}: {(time.perf_counter() - t) / 64 * 1000:.1f} ms/step (incl. prefill)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)
