"""What an engine leaves the process between engines: the collector's frozen heap and the
device memory the caching allocator holds (`Engine.__init__` freezes, `Engine.close` and
the next engine's build release)."""

from __future__ import annotations

import gc

import torch


# Whether `freeze_heap` froze the heap since `release_device_memory` last thawed it.
_ENGINE_FROZE = False


def release_device_memory(device: torch.device) -> None:
    """Give the driver back what this process holds on `device` but no longer uses: collect
    the reference cycles that keep a dropped engine's tensors alive, then return the caching
    allocator's free blocks (the driver counts those as ours, and so would the next plan),
    and lift the allocator limit the engine's plan set (`device_memory.allocator_limit`):
    a closed engine's budget no longer binds the process (a 2 GiB engine left every later
    allocation in the process under ~2 GiB). Frozen objects (`freeze_heap`) are thawed
    first: the collector never looks at them, so a dropped engine's cycles would stay.
    Only what an engine froze is thawed: a heap frozen by its owner (the test suite freezes
    its imports, so each of its ~400 closes scans what the tests made, not ~0.4 s of
    torch and transformers) stays frozen, and the dropped engine, made after it, is
    collected all the same."""
    global _ENGINE_FROZE
    if _ENGINE_FROZE:
        gc.unfreeze()
        _ENGINE_FROZE = False
    gc.collect()
    if device.type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def freeze_heap(device: torch.device) -> None:
    """Once an engine on a GPU is built: every object alive now (the model's modules, tables,
    graphs, the libraries' own) goes to the collector's permanent generation, so a full
    collection while serving scans only what serving allocated since. Why: a full
    collection of a built engine's process scans ~176K objects, 78 ms on the development
    VM (~0 frozen), and every 320-step decode run on the GPU machine had one step of 90–145
    ms at a step that moved from run to run (2026-12-05): a serving stall too, at ~5 ms a
    step. Not on the CPU, where a decode step is itself ~100 ms of compute and the test
    suite's thousand engines would pay a collection each (~50 s). `release_device_memory`
    thaws them."""
    global _ENGINE_FROZE
    if device.type != "cuda":
        return
    gc.collect()
    gc.freeze()
    _ENGINE_FROZE = True
