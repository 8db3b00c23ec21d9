"""What a model's experts allow of the MoE settings: biased experts (gpt-oss) run only
where the device's kernels compute them, since the CPU expert kernel has no biases yet."""

from __future__ import annotations

import logging
from dataclasses import replace

from edgemoe.config import EngineConfig, flag_name
from edgemoe.models.arch import ModelArch

log = logging.getLogger(__name__)

CPU_BACKENDS = ("cpu", "hybrid")


def gpu_experts_only(config: EngineConfig, arch: ModelArch) -> EngineConfig:
    """`config` for an arch whose experts the CPU can't compute (`arch.expert_bias`):
    cpu/hybrid refused, auto → offload, no CPU share of prompt chunks; else unchanged."""
    if not getattr(arch, "expert_bias", False):
        return config
    moe = config.moe
    if moe.moe_backend in CPU_BACKENDS:
        raise ValueError(f"{flag_name('moe_backend')} {moe.moe_backend}: {arch.model_type}'s experts have biases, "
                         "which the CPU expert kernel does not compute yet: use resident, offload or auto")
    if moe.moe_backend == "auto" or moe.prompt_cpu:
        log.warning("%s: biased experts run on the device only: --moe-backend %s, no CPU share of prompt misses",
                    arch.model_type, "offload" if moe.moe_backend == "auto" else moe.moe_backend)
    backend = "offload" if moe.moe_backend == "auto" else moe.moe_backend
    return replace(config, moe=replace(moe, moe_backend=backend, prompt_cpu=False))
