"""Build the runtime an Engine drives: tokenizer, model, experts, KV pool, attention."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from edgemoe.cache.kv_pool import KVPool
from edgemoe.config import EngineConfig
from edgemoe.layers.attention import AttentionBackend, TorchPagedAttention
from edgemoe.models.decoder import MoEDecoder, activation
from edgemoe.models.loader import load_checkpoint
from edgemoe.moe.executor import MoEExecutor, ResidentExecutor
from edgemoe.tokenizer import TokenizerBundle

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    model_dir: Path
    tokenizer: TokenizerBundle
    model: MoEDecoder
    executor: MoEExecutor
    pool: KVPool
    attention: AttentionBackend
    device: torch.device
    max_model_len: int


def resolve_model_dir(model: str | None) -> Path:
    if model is None:
        from edgemoe.testing.demo import demo_model_path

        return demo_model_path()
    return Path(model).expanduser()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available")
    return device


def default_kv_tokens(max_model_len: int) -> int:
    # NOTE: a CPU-sized default; the GPU memory planner replaces it when a budget exists.
    return max(max_model_len, min(2 * max_model_len, 65536))


def build_runtime(config: EngineConfig, progress: bool = True) -> Runtime:
    model_dir = resolve_model_dir(config.model.model)
    tokenizer = TokenizerBundle.load(model_dir)
    loaded = load_checkpoint(model_dir, config.model.dtype, progress=progress)
    arch = loaded.arch
    device = resolve_device(config.model.device)
    executor = ResidentExecutor(loaded.experts, device, activation(arch.hidden_act))
    model = MoEDecoder(arch, loaded.params, executor, device)
    del loaded
    max_len = config.model.max_model_len or arch.max_position_embeddings
    kv_tokens = config.cache.kv_tokens or default_kv_tokens(max_len)
    page = config.cache.page_size
    pool = KVPool(
        arch.num_layers, -(-kv_tokens // page), page, arch.num_kv_heads, arch.head_dim, arch.dtype, device
    )
    log.info("KV pool: %d pages x %d tokens (%.1f MiB)", pool.num_pages, page, pool.nbytes() / 2**20)
    return Runtime(model_dir, tokenizer, model, executor, pool, TorchPagedAttention(pool), device, max_len)
