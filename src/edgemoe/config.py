"""Engine configuration: frozen dataclasses, composed, one name per setting.

The CLI flag `--foo-bar`, the dataclass field `foo_bar` and the `LLM(foo_bar=...)`
keyword are the same setting. Every field carries its help text in `metadata`, so the
CLI builds its flags from these classes and cannot drift from them.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field, fields
from typing import Any


def setting(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A config field with its CLI help (and choices) attached."""
    meta: dict[str, Any] = {"help": help}
    if choices:
        meta["choices"] = choices
    return field(default=default, metadata=meta)


DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = setting(
        None,
        "model directory (Hugging Face layout), or random:PRESET[?field=value,...] for seeded random weights "
        "at a real shape (e.g. random:qwen3-30b-a3b); default: the demo model",
    )
    dtype: str = setting("auto", "weight/activation dtype; auto = the checkpoint's on a GPU, float32 on the CPU", DTYPES)
    device: str = setting("auto", "cpu, cuda, cuda:N; auto = cuda when available")
    gpu_memory: str | None = setting(
        None, "cap on everything the process holds on the GPU, CUDA context included (e.g. 16GiB); "
        "default: 90%% of the GPU's memory"
    )
    host_memory: str | None = setting(
        None, "cap on what the engine plans to hold in host RAM (e.g. 64GiB); default: what the OS reports available"
    )
    max_model_len: int | None = setting(None, "context length; default: the model's")
    seed: int = setting(0, "seed of the engine's shared sampling generator")
    ple_store: str = setting(
        "auto",
        "Qwen3.8-Flash-Next's n-gram per-layer embedding tables: device, host (pinned RAM, gathered over PCIe), "
        "or disk (files under --ple-dir, read ahead of each step); auto = device when they fit a quarter of the "
        "GPU budget (always on the CPU), else host when they fit half the RAM, else disk",
        ("auto", "device", "host", "disk"),
    )
    ple_dir: str | None = setting(
        None, "--ple-store disk: directory of the table files (written from the model on first use); "
        "default: under the cache directory",
    )
    embed_weights: str = setting(
        "auto", "token embedding: on the device, or in pinned host RAM gathered per step (host: frees its "
        "device memory for expert slots; not for tied embeddings); auto: host on a GPU whose experts don't "
        "all fit, for an untied embedding with host memory to spare, else device", ("auto", "device", "host"),
    )


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = setting(16, "tokens per KV page")
    cache_type: str = setting("radix", "prefix cache over KV pages (radix) or none", ("radix", "none"))
    kv_tokens: int | None = setting(None, "KV cache capacity in tokens; default: planned")
    state_slots: int | None = setting(
        None,
        "hybrid (GDN) models: device rows of recurrent state (~61 MiB each for Qwen3.5-35B-A3B), one per "
        "running request, so they cap --max-running-requests; default: planned",
    )
    host_cache: str | None = setting(
        None,
        "host RAM for KV pages (and GDN state snapshots) evicted from the prefix cache, copied back on a hit "
        "instead of recomputed (e.g. 16GiB); default: none",
    )
    kv_cache_dtype: str = setting(
        "auto", "KV cache storage: auto (the model's dtype) or fp8 (e4m3, a scale per token and kv head: half "
        "the memory, which goes to expert slots)", ("auto", "fp8"),
    )


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int = setting(64, "most requests decoding at once")
    max_prefill_tokens: int = setting(2048, "most prompt tokens prefilled in one step (longer prompts are chunked)")
    overlap: bool | None = setting(
        None,
        "overlap scheduling: the host schedules and launches step N+1 while step N runs, then reads step N's "
        "tokens (stop rules one step behind; outputs are exactly the serial loop's); default: on with a GPU, off "
        "on the CPU (where launching a step runs it); off with a disk PLE store or --routing synthetic (logged)",
    )


@dataclass(frozen=True)
class MoEConfig:
    moe_backend: str = setting(
        "auto",
        "where routed experts run: resident (all on the device), offload (slot cache, misses copied), "
        "cpu (misses computed on the host), hybrid (misses split live between copies and the CPU); "
        "auto = resident if they fit, else offload or hybrid as measured rates say (logged; no CPU share "
        "while other work keeps more than EDGEMOE_AUTO_BUSY_CORES=2 of its cores busy)",
        ("auto", "resident", "offload", "cpu", "hybrid"),
    )
    moe_slots: int | None = setting(None, "device expert slots shared by all layers; default: planned")
    moe_policy: str = setting(
        "lru",
        "slot eviction policy: lru (scan-resistant: when a step's experts outnumber the slots it keeps most of them "
        "and streams the rest through a few slots), lru-plain (pure LRU, A/B runs), lfu (host cache only)",
        ("lru", "lru-plain", "lfu"),
    )
    moe_hybrid_fraction: float | None = setting(
        None, "hybrid: fix the share of misses computed on the CPU (default: the live controller splits them; with "
        "--expert-cache device, each decode layer's misses in sixteenths, within --cpu-experts-per-layer if given)"
    )
    cpu_experts_per_layer: int | None = setting(
        None,
        "hybrid with --expert-cache device: fix the CPU's quota — the N coldest misses of each MoE layer run on the "
        "CPU inside the step (a C host function in the decode graph, no host read; steps of up to 64 tokens), the "
        "rest are moved to the GPU; 0 = offload exactly (default: a live share of each layer's own misses, chosen "
        "by timing decode steps)",
    )
    prompt_cpu: bool | None = setting(
        None,
        "hybrid/auto with --expert-cache device: prompt chunks give the CPU the missed experts with the fewest "
        "tokens, as many as it computes in the time the GPU copies the rest (learnt rates; a short agent turn "
        "after a cached prefix routes a few tokens to almost every expert); default: on wherever that CPU share "
        "runs (measured 1.3-2.5x the prefill rate without it on 128-700-token prompts, and half the agent turn's "
        "TTFT), --no-prompt-cpu copies every miss",
    )
    routing: str = setting(
        "router",
        "expert choices: the model's router, or synthetic[:seed=N,repeat=F,window=F,top=F,recall=F,precision=F], a "
        "seeded process with Qwen3-30B-A3B's published routing statistics replacing the router's ids (cache "
        "studies; recall < 1: decode prefetch predicts with that recall instead of an oracle, precision >= recall: "
        "a smaller guess of that precision; labelled in every output; refused by serve)",
    )
    expert_cache: str = setting(
        "auto",
        "where the slot cache's bookkeeping runs: host (each MoE layer's routing read back, misses planned in "
        "Python; the cpu/hybrid backends and auto's CPU split need it) or device (slot map, owners and LRU "
        "recency on the GPU, planned by device ops with no host read: offload decode steps are captured in CUDA "
        "graphs; --moe-policy lru or lru-plain, the offload backend (auto resolving to it) or hybrid with "
        "--cpu-experts-per-layer); auto: device on a GPU with the offload or auto backend and an LRU policy (and "
        "for hybrid with a CPU quota), else host",
        ("auto", "host", "device"),
    )
    expert_mover: str = setting(
        "gather",
        "--expert-cache device: how misses reach their slots: gather (a device kernel reads the pinned host store "
        "mapped into the GPU's address space; capturable; it takes SMs) or copy (the copy engine, eager, after "
        "reading each layer's miss list back; with EDGEMOE_COPIER=1, an experiment slower than gather (0.62-0.82 of "
        "it at full size), a host thread the captured step rings issues them: docs/offload.md). --moe-prefetch "
        "moves as this does",
        ("gather", "copy"),
    )
    expert_preload: str = setting(
        "auto",
        "offload/hybrid/cpu: fill the expert slots at start-up, each MoE layer an equal share, so the first "
        "prompt finds that share resident instead of copying every expert it routes to: on, off, or auto = on "
        "unless --expert-store mmap (the preload would read GBs from disk at start-up)",
        ("auto", "on", "off"),
    )
    moe_prefetch: str = setting(
        "off",
        "decode prefetch with the device expert cache: during each MoE layer, predict the next layer's experts "
        "(its router on this layer's input; under --routing synthetic the drawn ids, an oracle, or a guess of "
        "the spec's recall) and copy the "
        "predicted misses on a side stream up to three layers ahead of their compute (off by default: x1.39 at fp8 "
        "and x1.19 at bf16 with perfect prediction on the GPU machine, but x0.96 at fp8 with a guess of recall 0.8, "
        "its wrong guesses copied for nothing; unmeasured with a trained router; docs/offload.md); auto: on or "
        "off, whichever makes decode steps faster, measured while serving and re-checked (graphs captured for both; "
        "off where nothing can prefetch)",
        ("on", "off", "auto"),
    )
    expert_store: str = setting(
        "auto", "host expert memory: pinned, pageable, or mmap (straight from the checkpoint files)",
        ("auto", "pinned", "pageable", "mmap"),
    )
    expert_dtype: str = setting(
        "auto",
        "how routed experts are stored (host store, device slots, copies): bf16 (unquantised, in --dtype), "
        "fp8 (e4m3, 128x128 blocks), int8 (per channel), int4 (groups of 128), mxfp4 (OCP MX); "
        "auto = as the checkpoint stores them (an FP8/AWQ/GPTQ checkpoint stays quantised)",
        ("auto", "bf16", "fp8", "int8", "int4", "mxfp4"),
    )


@dataclass(frozen=True)
class KernelConfig:
    attention_backend: str = setting(
        "auto", "attention kernels: triton (GPU) or torch (the reference); auto = triton on a GPU with Triton",
        ("auto", "triton", "torch"),
    )
    dense_kernel: str = setting(
        "auto",
        "dense projections of decode batches (<= 32 tokens: attention q/k/v/o, GDN in/out, LM head; a MoE router "
        "runs fused with its top-k on a GPU either way): "
        "torch (cuBLAS), triton (a batch-invariant weight-streaming GEMV for every batch size) or auto "
        "(the Triton GEMV for one token, cuBLAS from two: on an H200 it beats cuBLAS at one token and loses "
        "from two); on a machine without a GPU every setting runs the torch reference; prefill-sized batches "
        "always take torch",
        ("torch", "triton", "auto"),
    )
    cuda_graph_max_bs: int = setting(32, "largest decode batch replayed from a CUDA graph (larger ones run eagerly)")
    no_cuda_graph: bool = setting(False, "run every decode step eagerly (no CUDA graphs)")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from flat keywords (`page_size=16`), validating every value."""
        parts: dict[str, Any] = {}
        for part in fields(cls):
            part_cls = part.default_factory  # type: ignore[misc]
            names = {f.name for f in fields(part_cls)}
            chosen = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            parts[part.name] = part_cls(**chosen)
        if kwargs:
            raise TypeError(
                f"unknown setting(s) {sorted(kwargs)}; known: {sorted(all_setting_names())}"
            )
        config = cls(**parts)
        config.validate()
        return config

    def validate(self) -> None:
        for part in (self.model, self.cache, self.scheduler, self.moe, self.kernels):
            for f in fields(part):
                choices = f.metadata.get("choices")
                value = getattr(part, f.name)
                _check_type(f.name, value, str(f.type))
                if choices and value not in choices:
                    raise ValueError(f"{flag_name(f.name)}={value!r}: choose one of {', '.join(choices)}")
        from edgemoe.moe.routing_spec import parse_routing  # torch-free

        parse_routing(self.moe.routing)
        if self.moe.moe_hybrid_fraction is not None and not 0.0 <= self.moe.moe_hybrid_fraction <= 1.0:
            raise ValueError(f"{flag_name('moe_hybrid_fraction')} must be in [0, 1] (got {self.moe.moe_hybrid_fraction})")
        # torch-free, so the config applies the executor registry's rules
        from edgemoe.moe.cache_choice import (
            check_backend_settings, check_cpu_quota, check_device_cache, check_prefetch, check_prompt_cpu,
        )

        check_backend_settings(self.moe.moe_backend, self.moe.moe_slots, self.moe.moe_hybrid_fraction)
        check_cpu_quota(self.moe.moe_backend, self.moe.expert_cache, self.moe.cpu_experts_per_layer)
        check_prompt_cpu(self.moe.moe_backend, self.moe.expert_cache, self.moe.prompt_cpu)
        check_prefetch(self.moe.moe_backend, self.moe.expert_cache, self.moe.expert_mover, self.moe.moe_prefetch)
        if self.moe.expert_cache == "device":
            check_device_cache(self.moe.moe_backend, self.moe.moe_policy)
        positive = {  # None: unset (planned); NOTE: 0 is a value, refused, never read as unset
            "moe_slots": self.moe.moe_slots,
            "page_size": self.cache.page_size,
            "max_running_requests": self.scheduler.max_running_requests,
            "max_prefill_tokens": self.scheduler.max_prefill_tokens,
            "kv_tokens": self.cache.kv_tokens,
            "state_slots": self.cache.state_slots,
            "max_model_len": self.model.max_model_len,
            "cuda_graph_max_bs": self.kernels.cuda_graph_max_bs,
        }
        for name, value in positive.items():
            if value is not None and value < 1:
                raise ValueError(f"{flag_name(name)} must be >= 1 (got {value})")
        if self.model.seed < 0:  # random.Random(-5) is Random(5): two seeds, one generator
            raise ValueError(f"{flag_name('seed')} must be >= 0 (got {self.model.seed})")


# What a setting's annotation accepts (the CLI's parsers give these; `LLM(**settings)` may not).
_TYPES: dict[str, tuple[type, ...]] = {"int": (numbers.Integral,), "float": (numbers.Real,), "bool": (bool,),
                                       "str": (str,)}  # numbers.*: numpy's scalars too


def _check_type(name: str, value: Any, annotation: str) -> None:
    """A TypeError naming the setting for a value its annotation refuses (a bool is no number)."""
    base, optional = annotation.removesuffix(" | None"), annotation.endswith(" | None")
    if value is None and optional:
        return
    accepted = _TYPES.get(base)
    if accepted is None:
        return
    if not isinstance(value, accepted) or (base != "bool" and isinstance(value, bool)):
        raise TypeError(f"{flag_name(name)} must be {'an ' if base == 'int' else 'a '}{base}"
                        f"{' or None' if optional else ''} (got {value!r})")


def setting_fields() -> list[dataclasses.Field[Any]]:
    """Every leaf setting of EngineConfig, in declaration order."""
    out: list[dataclasses.Field[Any]] = []
    for part in fields(EngineConfig):
        out.extend(fields(part.default_factory))  # type: ignore[arg-type]
    return out


def all_setting_names() -> list[str]:
    return [f.name for f in setting_fields()]


def three_state(f: dataclasses.Field[Any]) -> bool:
    """A `bool | None` setting: unset decides at start-up, so its flag is `--foo` / `--no-foo`."""
    return str(f.type) == "bool | None"


def setting_argv(settings: dict[str, Any]) -> list[str]:
    """The flags that give `settings` to a child `edgemoe serve` (`launch`, `bench agent`): a
    switch alone, `--no-foo` for a `bool | None` setting set False, else the value as text."""
    optional = {f.name for f in setting_fields() if three_state(f)}
    argv: list[str] = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else [f"--no-{flag[2:]}"] if name in optional else []
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def flag_name(name: str) -> str:
    """How errors name a setting: the keyword and its CLI flag."""
    return f"{name} (--{name.replace('_', '-')})"
