"""Build the runtime an Engine drives: tokenizer, weights, memory plan, experts, KV."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from edgemoe.cache.host_tier import HostTier
from edgemoe.cache.kv_pool import KVPool
from edgemoe.cache.page_table import PageTable
from edgemoe.cache.state_pool import StatePool
from edgemoe.config import EngineConfig, SchedulerConfig, flag_name
from edgemoe.engine.batch_buffers import BatchBuffers
from edgemoe.engine.budget import GiB, MemoryPlan, parse_size, slot_pool_warning
from edgemoe.engine.device_memory import allocator_limit
from edgemoe.engine.device_plan import plan_device
from edgemoe.engine.graphs import DecodePadding, graph_sizes
from edgemoe.engine.host_budget import HostRow
from edgemoe.engine.model_source import ModelSource, load_model, resolve_model
from edgemoe.engine.runner import ModelRunner
from edgemoe.kernels.dense_gemv import make_dense_linear
from edgemoe.layers.attention_backend import AttentionBackend, make_attention_backend
from edgemoe.layers.embedding import HostEmbedding
from edgemoe.models.arch import ModelArch, expert_activation, shared_kv
from edgemoe.models.loader import ram_tables
from edgemoe.models.registry import model_module
from edgemoe.models.transformer import CausalLM
from edgemoe.moe.cache_choice import resolve_expert_cache
from edgemoe.moe.executor import MoEExecutor
from edgemoe.moe.pinning import CudaRegistrar
from edgemoe.moe.registry import make_executor
from edgemoe.moe.routing_spec import ROUTER, parse_routing
from edgemoe.moe.routing_trace import RoutingTrace
from edgemoe.moe.slot_preload import preload_at_start
from edgemoe.moe.synthetic_routing import SyntheticRouting
from edgemoe.ple.store import PleStore
from edgemoe.profiling import StepProfiler
from edgemoe.tokenizer import TokenizerBundle

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    source: ModelSource
    model_dir: Path
    tokenizer: TokenizerBundle
    model: CausalLM
    executor: MoEExecutor
    pool: KVPool
    page_table: PageTable
    attention: AttentionBackend
    runner: ModelRunner
    profiler: StepProfiler
    device: torch.device
    max_model_len: int
    plan: MemoryPlan
    trace: RoutingTrace  # records the routing while a benchmark asks (bench decode)
    scheduler: SchedulerConfig  # the setting, max_running_requests as planned (hybrids: <= state rows)
    routing: str = ROUTER  # "router", or the synthetic process's label: in every output
    states: StatePool | None = None  # hybrid models: GDN state rows
    host_tier: HostTier | None = None  # --host-cache
    ple: PleStore | None = None  # Qwen3.8-Flash-Next: its PLE tables (--ple-store)
    overlap: bool = False  # --overlap as resolved (engine/overlap.py)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:  # torch's message lists device types the engine never runs on
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"{flag_name('device')}={name!r}: choose cpu, cuda, cuda:N or auto")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{flag_name('device')}={name!r} but CUDA is not available")
        if device.index is None:  # memory queries need an explicit index
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(setting: str, device: torch.device) -> str:
    """auto: the checkpoint's dtype on a GPU; float32 on the CPU, where bf16/fp16
    GEMMs without native support run many times slower than fp32."""
    if setting == "auto" and device.type == "cpu":
        return "float32"
    return setting


def host_store_kind(setting: str, device: torch.device) -> str:
    """auto: pinned when a GPU will copy from it (async copies), plain RAM otherwise."""
    if setting == "auto":
        return "pinned" if device.type == "cuda" else "ram"
    return "ram" if setting == "pageable" else setting


def make_runner(
    config: EngineConfig, model: CausalLM, attention: AttentionBackend, executor: MoEExecutor,
    buffers: BatchBuffers, profiler: StepProfiler, table: PageTable, pool: KVPool,
    routing: SyntheticRouting | None = None, states: StatePool | None = None, ple: PleStore | None = None,
) -> ModelRunner:
    """The runner. With a graph-safe attention backend on a GPU, decode batches are padded
    to fixed sizes — always, so CUDA graphs on and off, and every MoE backend, run the
    same shapes and compute the same bits — and captured when the executor allows
    it (resident experts, the device expert cache's gather; synthetic routing too) unless
    `--no-cuda-graph`."""
    executor.stats.count_in_forward = False
    pads = attention.graph_safe and attention.pool.k.is_cuda
    max_bs = min(config.kernels.cuda_graph_max_bs, table.max_rows)
    padding = DecodePadding(graph_sizes(max_bs), table.scratch_row, pool.scratch_page) if pads else None
    runner = ModelRunner(model, attention, buffers, profiler, padding, executor.stats.add_tokens, routing, states, ple,
                         executor.set_live_rows, executor)
    # Synthetic routing (cache studies) stages each step's ids in a static device buffer: graph-safe.
    if (pads and executor.graph_safe and not config.kernels.no_cuda_graph and (ple is None or ple.graph_safe)
            and (routing is None or routing.graph_safe)):
        seconds = runner.capture_graphs()
        executor.stats.reset()  # warm-up and capture routed padding tokens
        log.warning("captured CUDA graphs for decode batches of %s sequences in %.1f s", padding.sizes, seconds)  # type: ignore[union-attr]
    return runner


def warn_about_plan(plan: MemoryPlan, arch: ModelArch, max_len: int) -> None:
    """What a person starting the engine should know about the plan's limits."""
    if max_len > arch.max_position_embeddings:  # transformers takes any position: so do we, but say so
        log.warning(
            "--max-model-len %d is past the %d positions the model serves (config.json's max_position_embeddings, "
            "scaled by its rope_scaling): the model was not trained on the positions past them",
            max_len, arch.max_position_embeddings,
        )
    if plan.kv_tokens < max_len:
        log.warning(
            "the KV cache holds %d tokens, less than the context length %d: a request that outgrows it "
            "finishes with finish_reason 'length' (raise --kv-tokens or --gpu-memory, or lower --max-model-len)",
            plan.kv_tokens, max_len,
        )
    small_pool = slot_pool_warning(plan.num_slots, len(arch.moe_layers), arch.moe_pairs)
    if small_pool:
        log.warning("%s", small_pool)


def build_runtime(config: EngineConfig, progress: bool = True) -> Runtime:
    source = resolve_model(config.model.model)
    tokenizer = TokenizerBundle.load(source.model_dir)
    device = resolve_device(config.model.device)
    dtype = resolve_dtype(config.model.dtype, device)
    arch = source.arch(dtype)
    max_len = config.model.max_model_len or arch.max_position_embeddings
    host_cache = host_cache_bytes(config)
    cache_row = (HostRow("host cache", host_cache, "--host-cache: evicted KV pages and state snapshots"),)
    store_kind = host_store_kind(config.moe.expert_store, device)
    tables, plan, host_rows = plan_device(config, source, arch, device, max_len, store_kind,
                                          cache_row if host_cache else ())
    # WARNING level on purpose: the plan is what a person starting a server wants to see.
    log.warning("%s", plan.table())
    warn_about_plan(plan, arch, max_len)
    torch_limit = None
    if plan.budget is not None:  # the cap on the caching allocator too
        torch_limit = allocator_limit(plan, device)
        torch_limit(0)
    loaded = load_model(
        source, arch, expert_store=store_kind, device=device,
        host_memory=config.model.host_memory, device_plan=plan, progress=progress,
        extra=host_rows,
        table_alloc=tables.ple.alloc if tables.ple else ram_tables,
        expert_dtype=config.moe.expert_dtype,
    )
    sched = replace(config.scheduler, max_running_requests=plan.max_running)
    max_tokens = sched.max_prefill_tokens + sched.max_running_requests  # the largest step
    profiler = StepProfiler(device)
    expert_cache = resolve_expert_cache(config.moe.expert_cache, device.type, plan.backend, config.moe.moe_policy,
                                        config.moe.cpu_experts_per_layer)
    if config.moe.expert_cache == "auto" and expert_cache == "device" and plan.backend != "resident":
        log.warning("expert cache on the device (--expert-cache auto): decode steps replay from CUDA graphs; "
                    "a CPU share of the misses where the backend has one (its quota by timing steps; prompt "
                    "chunks' fewest-token misses too unless --no-prompt-cpu)")
    executor = make_executor(
        plan.backend, loaded.experts, device, expert_activation(arch), arch.num_layers,
        plan.num_slots, config.moe.moe_policy, config.moe.moe_hybrid_fraction, max_tokens, arch.top_k,
        expert_cache, config.moe.expert_mover, config.moe.cpu_experts_per_layer, config.moe.prompt_cpu,
        lend_slots=plan.lend_slots,
        planned_tokens=plan.lend_tokens - 1 + sched.max_running_requests if plan.lend_slots else None,
    )
    lending = getattr(executor, "lending", None)
    if lending is not None and torch_limit is not None:
        lending.attach_limit(torch_limit)  # the slot banks' memory is outside torch's allocator
    preload_at_start(executor, config.moe.expert_preload, store_kind)
    executor.profiler = profiler
    executor.trace = trace = RoutingTrace()
    executor.routing = routing = make_routing(config.moe.routing, arch, max_tokens, device)
    if routing is not None:
        routing.trace = trace  # it records its draws: graph-replayed steps run no Python per layer
    registrar = CudaRegistrar(device) if device.type == "cuda" else None
    ple = tables.ple.store(loaded.tables, max_tokens, registrar) if tables.ple else None
    extras: dict[str, object] = {"ple_store": ple} if ple else {}
    if tables.embed_on_host:
        extras["embed"] = HostEmbedding(loaded.params.pop("embed"), device, registrar)
    linear = make_dense_linear(config.kernels.dense_kernel, device)
    model = model_module(arch.model_type).build(arch, loaded.params, executor, device, linear=linear, **extras)
    if config.moe.moe_prefetch != "off":
        enable_prefetch(executor, routing, arch, model.blocks, auto=config.moe.moe_prefetch == "auto")
    del loaded
    page = config.cache.page_size
    pool = KVPool(len(arch.kv_layers), -(-plan.kv_tokens // page), page, arch.num_kv_heads, arch.head_dim, arch.dtype,
                  device, config.cache.kv_cache_dtype, index_dim=arch.index_key_dim, shared_kv=shared_kv(arch))
    table = PageTable(sched.max_running_requests, min(pool.num_pages, pool.pages_for(max_len)), device, pool.scratch_page)
    attention = make_attention_backend(config.kernels.attention_backend, pool, device)
    overlap = resolve_overlap(config.scheduler.overlap, device, ple)
    buffers = BatchBuffers(max_tokens, sched.max_running_requests, table, page, overlap)
    states = make_state_pool(arch, plan, device)
    runner = make_runner(config, model, attention, executor, buffers, profiler, table, pool, routing, states, ple)
    if (share := getattr(executor, "cpu_share", None)) is not None:  # loaded, preloaded, captured: the host quiet
        share.measure_prior()
    host_tier = make_host_tier(host_cache, pool, states) if host_cache else None
    return Runtime(
        source, source.model_dir, tokenizer, model, executor, pool, table, attention, runner, profiler, device,
        max_len, plan, trace, sched, routing.label if routing else ROUTER, states, host_tier, ple, overlap,
    )


def enable_prefetch(executor: MoEExecutor, routing: SyntheticRouting | None, arch: ModelArch, blocks: list,
                    auto: bool = False) -> None:
    """--moe-prefetch on|auto: the device cache predicts with the next layer's router, the
    input scaled by the layers' norm gains (`blocks`: the model's; the drawn ids under
    synthetic routing: an oracle, said so); nothing to prefetch where everything is
    resident. auto: on or off by timing decode steps, and off (logged) where the cache's
    mover can't copy beside the chain."""
    from edgemoe.moe.device_offload import DeviceOffloadExecutor
    from edgemoe.moe.predictors import RouterPredictor, StagedPredictor, moe_input_gains, prefetch_min_prob

    flag = f"--moe-prefetch {'auto' if auto else 'on'}"
    if not isinstance(executor, DeviceOffloadExecutor):
        (log.info if auto else log.warning)("%s: every expert is resident (or the host cache runs): nothing to "
                                            "prefetch", flag)
        return
    predictor = StagedPredictor(routing) if routing is not None else \
        RouterPredictor(executor.routers, arch.top_k, moe_input_gains(blocks, set(executor.routers)),
                        prefetch_min_prob())
    try:
        executor.enable_prefetch(predictor, arch.top_k, auto=auto)
    except ValueError as e:
        if not auto:
            raise
        log.info("%s: off (%s)", flag, e)
        return
    log.warning("decode prefetch %s: predicted by %s", "auto (on or off by timing decode steps)" if auto else "on",
                predictor.label)


def resolve_overlap(setting: bool | None, device: torch.device, ple: PleStore | None) -> bool:
    """--overlap: on by default with a GPU (on the CPU, launching a step computes it: nothing
    to overlap). Off, logged, where the host must see step N's tokens before step N+1: a
    PLE store hashing n-grams on the host (disk) fills N+1's rows from them. Synthetic
    routing overlaps too: each sequence draws from its own numbers
    (`moe/synthetic_routing.py`), so the extra step overlap computes for a request that
    has just finished changes no other sequence's draws, and a cache study's routing is
    the serial loop's."""
    wanted = device.type == "cuda" if setting is None else setting
    if wanted and ple is not None and not ple.hashes_on_device:
        log.warning("overlap scheduling is off: the PLE store hashes n-grams on the host and needs each step's "
                    "tokens before the next")
        return False
    return wanted


def make_routing(setting: str, arch: ModelArch, max_tokens: int, device: torch.device) -> SyntheticRouting | None:
    """The router override `--routing` asks for (None: the model's router), logged; its
    ids staged on `device` for steps of up to `max_tokens` tokens."""
    spec = parse_routing(setting)
    if spec is None:
        return None
    routing = SyntheticRouting(spec, list(arch.moe_layers), arch.num_experts, arch.top_k, max_tokens, device)
    # WARNING level on purpose: nothing this run measures about the cache is a real model's.
    log.warning(
        "routing %s: the router's expert choices are replaced by a seeded process (cache studies only; "
        "hit rates, speeds and tokens are not a real model's)", routing.label,
    )
    return routing


def host_cache_bytes(config: EngineConfig) -> int:
    """`--host-cache` in bytes (0: no host tier); refused without the prefix cache."""
    setting = config.cache.host_cache
    if setting is None:
        return 0
    if config.cache.cache_type == "none":
        raise ValueError(f"{flag_name('host_cache')} needs the prefix cache (--cache-type radix)")
    try:
        return parse_size(setting)
    except ValueError:
        raise ValueError(f"{flag_name('host_cache')}: cannot parse size {setting!r} (e.g. 16GiB)") from None


def make_host_tier(nbytes: int, pool: KVPool, states: StatePool | None) -> HostTier:
    """Half of it for GDN state snapshots (hybrid models), the rest for KV pages."""
    snapshot_slots = nbytes // 2 // states.shape.row_nbytes if states is not None else 0
    used = snapshot_slots * states.shape.row_nbytes if states is not None else 0
    tier = HostTier(pool, (nbytes - used) // pool.page_nbytes, states, snapshot_slots)
    log.warning("host cache: %.2f GiB (%d KV pages, %d state snapshots)", tier.nbytes() / GiB,
                tier.pages[0].shape[0], snapshot_slots)
    return tier


def make_state_pool(arch: ModelArch, plan: MemoryPlan, device: torch.device) -> StatePool | None:
    """Hybrid models: a state row per page-table row, the scratch row included (so live
    row r is request row r); the plan's other rows are for snapshots."""
    shape = arch.state_shape()
    if shape is None:
        return None
    return StatePool(shape, plan.max_running + 1, plan.snapshot_rows, device)
