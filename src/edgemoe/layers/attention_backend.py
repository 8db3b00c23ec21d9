"""The attention backend interface and its registry.

A backend owns how one layer's attention runs over the paged KV cache for a whole
batch. The engine calls `prepare(batch)` once per step, before the forward; each
attention layer then calls `write_kv` (this step's keys/values into the cache) and
`attend`. Backends are chosen by name and imported lazily, so an optional accelerator
library loads only when chosen.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.kernels.rotary import apply_rope
from edgemoe.layers.batch import ForwardBatch
from edgemoe.layers.norm import RMSNorm


class RopeTable(NamedTuple):
    """Rotary tables by position, fp32 [max_positions, rotary_dim / 2] (scaling included)."""

    cos: torch.Tensor
    sin: torch.Tensor


class HeadNorms(NamedTuple):
    """A layer's per-head q/k RMSNorms (Qwen3's q_norm/k_norm, `qk_norm="head"`), handed to
    `rotate_and_write` to apply to each head before rotary."""

    q: RMSNorm
    k: RMSNorm

    @property
    def fusable(self) -> bool:
        """Plain RMSNorms (weight offset 0) sharing one eps: what `rope_write_kv` fuses."""
        return self.q.weight_offset == 0.0 and self.k.weight_offset == 0.0 and self.q.eps == self.k.eps


@dataclass(frozen=True)
class AttentionSpec:
    """One attention layer's constants."""

    layer: int  # index into the KV pool's layers
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window: int | None = None  # sliding window in tokens (None: full causal)
    rope: RopeTable | None = None  # for backends that rotate by position in a fused kernel
    # Attention sinks (gpt-oss): [num_heads] float32 on the model's device, query head h's
    # logit in each row's softmax denominator (no value). NOTE: kept out of eq/hash (a tensor).
    sinks: torch.Tensor | None = field(default=None, compare=False)


class AttentionBackend(ABC):
    """Contract:
    - `prepare(batch)` is called once per step before any layer runs; it may build
      per-step metadata from `batch` (device work only, no host synchronisation) and
      keep it until the next `prepare`.
    - `write_kv(spec, k, v, batch)` stores k/v [T, Hkv, D] at `batch.out_loc` in layer
      `spec.layer` of the pool; `attend(spec, q, batch)` then returns [T, Hq, D]: each
      sequence's new queries attend causally to its first `seq_lens[b]` positions
      (the tokens just written included), through its page-table row; only to the last
      `spec.window` of them when set; with `spec.sinks`, head h's softmax denominator
      also holds exp(sinks[h]) (no value), in prefill/extend and decode alike.
    - The pages the batch references stay allocated until the step's kernels finish
      (the scheduler frees pages only between steps).
    - `rotate_and_write(spec, q, k, v, cos, sin, batch, norms=None)` applies the head
      norms when given (`norms.q` to every q head, `norms.k` to every k head, as the
      norms' own `__call__` computes them), then rotary to q/k, and writes k/v, returning
      the rotated q; `v` None: the value is the key (a pool whose V is K's tensor, MLA's
      latent row), rotated k written once; `write_kv` takes `v` None the same way. q/k/v may be strided views (heads of one fused projection). The
      default uses this step's tables (cos/sin [T, D], in the activations' dtype) and
      applies the norms as separate ops; a backend with `needs_step_rope = False` rotates
      from `spec.rope` by position in one fused kernel (the model then skips building
      the step tables: cos/sin are None), which may fuse `norms` too when
      `norms.fusable` (the result then agrees with the separate ops to a rounding of the
      dtype: the fused norm's fp32 sum of squares runs in another order).
    - Graph hooks: `capture_batch(batch)` / `replay_batch(batch)` let a backend keep
      its per-step metadata at fixed addresses for a CUDA graph; the defaults do what
      `prepare` does, which suits backends whose metadata lives in the batch buffers.
      `graph_safe` says whether its kernels may be captured at all.
    """

    needs_step_rope = True
    graph_safe = False

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def prepare(self, batch: ForwardBatch) -> None:  # noqa: B027 - optional hook
        """Per-step metadata (default: none)."""

    @abstractmethod
    def write_kv(self, spec: AttentionSpec, k: torch.Tensor, v: torch.Tensor | None, batch: ForwardBatch) -> None: ...

    @abstractmethod
    def attend(self, spec: AttentionSpec, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor: ...

    def forward(
        self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        self.write_kv(spec, k, v, batch)
        return self.attend(spec, q, batch)

    def rotate_and_write(
        self, spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
        cos: torch.Tensor | None, sin: torch.Tensor | None, batch: ForwardBatch, norms: HeadNorms | None = None,
    ) -> torch.Tensor:
        assert cos is not None and sin is not None, "this backend needs the step's rotary tables"
        if norms is not None:
            q, k = norms.q(q), norms.k(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.write_kv(spec, k, v, batch)
        return q

    def capture_batch(self, batch: ForwardBatch) -> None:
        self.prepare(batch)

    def replay_batch(self, batch: ForwardBatch) -> None:
        self.prepare(batch)


# name -> (module, class); imported only when chosen.
ATTENTION_BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("edgemoe.layers.torch_attention", "TorchPagedAttention"),
    "triton": ("edgemoe.layers.triton_attention", "TritonPagedAttention"),
}


def make_attention_backend(name: str, pool: KVPool, device: torch.device) -> AttentionBackend:
    """The backend named by `--attention-backend` (auto: Triton on a GPU with Triton and
    a 2-byte KV dtype, the torch reference otherwise)."""
    if name == "auto":
        from edgemoe.kernels.backend import FAST_DTYPES, triton_importable

        fast = device.type == "cuda" and pool.k.dtype in FAST_DTYPES and triton_importable()
        name = "triton" if fast else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {name!r}: choose one of auto, {', '.join(ATTENTION_BACKENDS)}")
    module, cls = ATTENTION_BACKENDS[name]
    backend_cls = getattr(importlib.import_module(module), cls)
    return backend_cls(pool, device)
