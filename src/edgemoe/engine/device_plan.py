"""The device memory plan at start-up: what the process may hold on the GPU
(`device_budget`), the tables kept off it (`big_tables.py`, the token embedding by
`--embed-weights auto` once the plan says whether experts stay off the device), and the
plan itself (`budget.plan_memory` with the engine's settings)."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from edgemoe.config import CacheConfig, EngineConfig, flag_name
from edgemoe.engine.big_tables import TablePlan, auto_embed_on_host, plan_tables
from edgemoe.engine.budget import GiB, MemoryPlan, parse_size, plan_memory
from edgemoe.engine.device_memory import baseline, process_share
from edgemoe.engine.host_budget import HostRow, host_budget
from edgemoe.engine.model_source import ModelSource, host_plan
from edgemoe.engine.process_memory import release_device_memory
from edgemoe.models.arch import ModelArch
from edgemoe.moe.cache_choice import resolve_expert_cache

log = logging.getLogger(__name__)


def plan_device(
    config: EngineConfig, source: ModelSource, arch: ModelArch, device: torch.device, max_len: int, store_kind: str,
    extra_host_rows: tuple[HostRow, ...],
) -> tuple[TablePlan, MemoryPlan, tuple[HostRow, ...]]:
    """(the tables' plan, the device plan, the host plan's rows beside the expert store and
    dense weights): `extra_host_rows` and the tables'. The embedding goes to host memory
    under `--embed-weights auto` where the plan keeps experts off the device and the host
    plan (expert store `store_kind`) has room for it; the plan is then made again."""
    measured = device_budget(config, device)
    tables = plan_tables(config, source, arch, device, measured[0], host_budget(config.model.host_memory)[0])
    plan = make_plan(config, arch, device, max_len, source, tables, measured)
    rows = (*extra_host_rows, *tables.host_rows(arch, device.type == "cuda"))

    def host_room() -> int:
        need = host_plan(source, arch, store_kind, device, config.model.host_memory, plan, rows,
                         config.moe.expert_dtype)
        return need.available - need.total

    if auto_embed_on_host(config.model.embed_weights, arch, device, plan.backend, host_room):
        tables = replace(tables, embed_on_host=True)  # its device bytes to the slots
        plan = make_plan(config, arch, device, max_len, source, tables, measured)
        rows = (*extra_host_rows, *tables.host_rows(arch, True))
    return tables, plan, rows


def device_budget(config: EngineConfig, device: torch.device) -> tuple[int | None, int]:
    """(cap in bytes, bytes the process already holds: CUDA context + cuBLAS). The cap
    counts this process alone (engine/device_memory.py); it is never more than this
    process holds plus what the device has free."""
    requested = parse_size(config.model.gpu_memory) if config.model.gpu_memory else None  # a typo fails on a CPU too
    if device.type != "cuda":
        return None, 0
    before = baseline(device.index)  # read before our context exists on the device (or the first engine's)
    release_device_memory(device)  # what an earlier engine here left unreferenced is not ours to count
    torch.cuda.set_device(device)
    a = torch.ones(64, 64, device=device)
    (a @ a).sum().item()  # materialise the context and the cuBLAS workspace
    del a
    free, total = torch.cuda.mem_get_info(device)
    ours = before.ours(floor=torch.cuda.memory_reserved(device)) if before else None
    cap, context = process_share(total, free, ours, requested)
    others = total - free - context
    if others >= 256 << 20:
        log.warning("other processes hold %.2f GiB of the device: --gpu-memory counts this process's share only",
                    others / GiB)
    if requested is not None and cap < requested:
        log.warning("--gpu-memory %s is more than this process can have (%.2f GiB held + %.2f GiB free); "
                    "planning for %.2f GiB", config.model.gpu_memory, context / GiB, free / GiB, cap / GiB)
    return cap, context


def make_plan(
    config: EngineConfig, arch: ModelArch, device: torch.device, max_len: int, source: ModelSource | None = None,
    tables: TablePlan | None = None, measured: tuple[int | None, int] | None = None,
) -> MemoryPlan:
    """`tables`: what the model's big tables reserve (PLE, a host embedding); `measured`:
    `device_budget`'s answer when the caller already has it."""
    budget, context = measured or device_budget(config, device)
    fmt = source.expert_format(config.moe.expert_dtype, arch) if source is not None else None
    method = source.quant_method if source is not None else None
    moe, sched = config.moe, config.scheduler
    if moe.moe_slots is not None and moe.moe_slots < arch.top_k:
        raise ValueError(f"{flag_name('moe_slots')} must be at least num_experts_per_tok = {arch.top_k}")
    plan = plan_memory(
        arch,
        backend=moe.moe_backend,
        moe_slots=moe.moe_slots,
        kv_tokens=config.cache.kv_tokens,
        max_model_len=max_len,
        max_prefill_tokens=sched.max_prefill_tokens,
        max_running=sched.max_running_requests,
        budget=budget,
        context=context,
        expert_format=fmt,
        dense_note=dense_note(method, tables),
        kv_cache_dtype=config.cache.kv_cache_dtype,
        graph_max_bs=graph_max_bs(config, device),
        state_slots=config.cache.state_slots,
        snapshots=config.cache.cache_type == "radix",
        extras=tables.device_rows() if tables else (),
        host_params=tables.host_params if tables else (),
        lend_tokens=lend_tokens(config, device),
    )
    # The pool holds whole pages: a larger one outgrows the plan (the default page stays: a tiny context's one page).
    if config.cache.page_size > max(plan.kv_tokens, CacheConfig().page_size):
        raise ValueError(f"{flag_name('page_size')} {config.cache.page_size} is more than the KV cache's "
                         f"{plan.kv_tokens} tokens: lower --page-size or raise --kv-tokens")
    return plan


def lend_tokens(config: EngineConfig, device: torch.device) -> int:
    """The prompt chunks that stream through the device cache and may borrow the slot
    banks' tail for their workspace (`moe/slot_lending.py`): the streaming threshold, or 0
    where none can (a CPU, the host cache, a driver without virtual memory management,
    `EDGEMOE_LEND_SLOTS=0`)."""
    from edgemoe.moe.lendable_memory import vmm_granularity
    from edgemoe.moe.slot_lending import lend_tokens as lend_setting

    if device.type != "cuda":
        return 0
    moe = config.moe
    backend = "offload" if moe.moe_backend == "auto" else moe.moe_backend
    cache = resolve_expert_cache(moe.expert_cache, device.type, backend, moe.moe_policy, moe.cpu_experts_per_layer)
    if cache != "device" or vmm_granularity(device) is None:
        return 0
    return lend_setting()


def graph_max_bs(config: EngineConfig, device: torch.device) -> int:
    """The largest decode batch the plan reserves graph memory for (0: no graphs)."""
    if device.type != "cuda" or config.kernels.no_cuda_graph:
        return 0
    return min(config.kernels.cuda_graph_max_bs, config.scheduler.max_running_requests)


def dense_note(method: str | None, tables: TablePlan | None) -> str:
    """What the plan's dense weights row says of them: a quantised checkpoint's dense layers
    dequantised (MXFP4 quantises only experts), the token embedding left in host RAM."""
    notes = [f"{method} checkpoint, dequantised at load"] if method and method != "mxfp4" else []
    return ", ".join(notes + (["token embedding in host RAM"] if tables and tables.embed_on_host else []))
