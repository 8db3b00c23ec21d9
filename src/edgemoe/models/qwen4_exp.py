"""Qwen3.8-Flash-Next (`qwen4_exp`, text part `qwen4_exp_text`): GDN + QSA-indexed gated
attention, 512 experts top-10 plus a shared expert, hyper-connections, and hashed n-gram
per-layer embeddings (PLE) on some GDN layers (`models/qwen4_arch.py` has the shape).

A block (transformers' `Qwen4ExpTextDecoderLayer`), h [T, hc·H] the hyper-connection streams:

    h = h + ple(h)                           (PLE layers only)
    x, g = attn_hc.mix(h);  h = h + mixer(x) ⊗ g
    x, g = mlp_hc.mix(h);   h = h + moe(x) ⊗ g

after the embedding repeated hc times; the final mixer's x feeds the LM head (no norms
anywhere else). The multimodal checkpoint (`qwen4_exp`: `text_config`, tensors under
`model.language_model.*`) loads its language model; the vision tower and MTP weights are
not read. The PLE tables are not params: the loader hands them to the PLE store
(`table_shapes`), from their `shard_K` row chunks or whole (`ngram_embedding.weight`, as
transformers 5's `save_pretrained(save_original_format=False)` writes them), and their
hash constants (`layer_multipliers`, `ngram_heads_*`, buffers a checkpoint may carry) are
derived from config.json as transformers derives them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from edgemoe.kernels.dense_gemv import Linear, dense_gemv_ref
from edgemoe.kernels.gdn_backends import gdn_kernels
from edgemoe.layers.attention_backend import AttentionSpec, RopeTable
from edgemoe.layers.context import StepContext
from edgemoe.layers.gdn import GatedDeltaNet, GdnSpec
from edgemoe.layers.hyper_connection import HyperConnection
from edgemoe.layers.norm import OffsetRMSNorm
from edgemoe.layers.ple import PleLayer
from edgemoe.layers.qsa_attention import QsaAttention, QsaSpec
from edgemoe.layers.rotary import Rotary
from edgemoe.models.arch import HFConfig
from edgemoe.models.hf_config import text_config as hf_text_config
from edgemoe.models.names import NameMap, Placement, Stacked, StackedMap
from edgemoe.models.qwen4_arch import PLE_CONV, Qwen4ExpArch, qwen4_arch
from edgemoe.models.qwen_hybrid import (
    IGNORED_PREFIXES,
    Mixer,
    Params,
    _attention_names,
    _gdn_names,
    _mlp,
    _mlp_names,
    to_device,
)
from edgemoe.models.qwen_hybrid import stacked_expert_names as hybrid_stacked_names
from edgemoe.models.transformer import CausalLM
from edgemoe.moe.executor import MoEExecutor
from edgemoe.ple.inputs import PleInputs
from edgemoe.ple.store import PleStore

MODEL_TYPE, TEXT_MODEL_TYPE = "qwen4_exp", "qwen4_exp_text"
# Hash constants a checkpoint carries as buffers; derived from config.json instead (ple/geometry.py).
IGNORED_SUFFIXES = ("ple_embedding.layer_multipliers", "ple_embedding.ngram_heads_vocab_sizes",
                    "ple_embedding.ngram_heads_offsets")
__all__ = ["IGNORED_PREFIXES", "IGNORED_SUFFIXES", "arch", "build", "checkpoint_map", "stacked_expert_names",
           "text_config"]


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's settings (`hf_config.text_config`: a multimodal config's
    `text_config` under its top level's tie_word_embeddings and dtype), or the config itself."""
    return hf_text_config(config, MODEL_TYPE, TEXT_MODEL_TYPE)


def arch(config: dict[str, Any]) -> Qwen4ExpArch:
    multimodal = config.get("model_type") == MODEL_TYPE
    return qwen4_arch(HFConfig(text_config(config)), model_type=MODEL_TYPE if multimodal else TEXT_MODEL_TYPE,
                      checkpoint_prefix="model.language_model." if multimodal else "model.")


def checkpoint_map(a: Qwen4ExpArch) -> NameMap:
    pre = a.checkpoint_prefix
    m: NameMap = {f"{pre}embed_tokens.weight": Placement("embed")}
    if not a.tie_word_embeddings:
        m["lm_head.weight"] = Placement("lm_head")
    m |= _hc_names(a, f"{pre}hyper_connection_mixer.", "mixer_", inject=False)
    for i in range(a.num_layers):
        lp, our = f"{pre}layers.{i}.", f"layers.{i}."
        m |= _hc_names(a, lp + "attn_hyper_connection.", our + "hc_attn_")
        m |= _hc_names(a, lp + "mlp_hyper_connection.", our + "hc_mlp_")
        if i in a.gdn_layers:
            m |= _gdn_split_names(a, lp + "linear_attn.", our)
        else:
            m |= _indexed_names(lp + "self_attn.", our, a)
        m |= _mlp_names(a, i, lp + "mlp.", our)
        if i in a.ple_layers:
            m |= _ple_names(a, a.ple_layers.index(i), lp + "ple.", our)
    return m


def _hc_names(a: Qwen4ExpArch, lp: str, our: str, inject: bool = True) -> NameMap:
    R = a.hc_lowrank
    m = {lp + "hc_norm.weight": Placement(our + "norm"), lp + "input_mix_weight_up.weight": Placement(our + "up")}
    if not inject:
        return m | {lp + "input_mix_weight_down.weight": Placement(our + "down")}
    return m | {lp + "input_mix_weight_down.weight": Placement(our + "down", (slice(0, R),)),
                lp + "block_inject_weight.weight": Placement(our + "down", (slice(R, None),))}


def _gdn_split_names(a: Qwen4ExpArch, lp: str, our: str) -> NameMap:
    qk, v, hv = 2 * a.linear_num_key_heads * a.linear_key_head_dim, a.value_width, a.linear_num_value_heads
    rows = {"qkv": (0, qk + v), "z": (qk + v, qk + 2 * v), "b": (qk + 2 * v, qk + 2 * v + hv),
            "a": (qk + 2 * v + hv, qk + 2 * v + 2 * hv)}
    m = _gdn_names(lp, our)
    for name, (lo, hi) in rows.items():
        m[lp + f"in_proj_{name}.weight"] = Placement(our + "in_proj", (slice(lo, hi),))
    return m


def _indexed_names(lp: str, our: str, a: Qwen4ExpArch) -> NameMap:
    return _attention_names(a, lp, our) | {  # type: ignore[arg-type]
        lp + "indexer.index_qk_proj.weight": Placement(our + "idx_qk"),
        lp + "indexer.q_layernorm.weight": Placement(our + "idx_q_norm"),
        lp + "indexer.k_layernorm.weight": Placement(our + "idx_k_norm"),
    }


def _ple_names(a: Qwen4ExpArch, j: int, lp: str, our: str) -> NameMap:
    assert a.ple is not None
    m = {lp + f"{src}.weight": Placement(our + dst) for src, dst in (
        ("key_proj", "ple_key"), ("value_proj", "ple_value"), ("norm_key", "ple_norm_key"),
        ("norm_query", "ple_norm_query"), ("norm_conv", "ple_norm_conv"), ("conv1d", "ple_conv"))}
    start = 0
    for k, n in enumerate(a.ple.chunk_rows(j)):  # the table in torch.chunk row chunks
        m[lp + f"ple_embedding.ngram_embedding.shard_{k}.weight"] = Placement(f"ple.{j}", (slice(start, start + n),))
        start += n
    return m


def stacked_expert_names(a: Qwen4ExpArch) -> StackedMap:
    """The one-tensor spellings the loader accepts for several of ours: the routed experts
    stacked (`qwen_hybrid`), and each PLE table whole, `ngram_embedding.weight`, which
    transformers holds at run time (its `Concatenate(dim=0)` of the shards) and so
    `save_pretrained(save_original_format=False)` writes."""
    m = hybrid_stacked_names(a)
    for j, i in enumerate(a.ple_layers):
        assert a.ple is not None
        lp = f"{a.checkpoint_prefix}layers.{i}.ple.ple_embedding.ngram_embedding."
        shards = tuple(lp + f"shard_{k}.weight" for k in range(len(a.ple.chunk_rows(j))))
        m[lp + "weight"] = Stacked(Placement(f"ple.{j}"), shards)
    return m


# -- assembly ------------------------------------------------------------------------------


class Qwen4Block:
    """PLE (some GDN layers), then the mixer and the MoE each between a hyper-connection mix
    and its injection."""

    def __init__(self, mixer: Mixer, attn_hc: HyperConnection, mlp: Any, mlp_hc: HyperConnection,
                 ple: PleLayer | None, region: str) -> None:
        self.mixer, self.attn_hc, self.mlp, self.mlp_hc = mixer, attn_hc, mlp, mlp_hc
        self.ple, self.region = ple, region

    def __call__(
        self, h: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, ctx: StepContext
    ) -> torch.Tensor:
        if self.ple is not None:
            with ctx.profiler.region("ple"):
                h = self.ple(h, ctx)
        with ctx.profiler.region(self.region):
            x, g, h = self.attn_hc.mix(h)
            assert g is not None
            y = self.mixer(x, cos, sin, ctx)
        with ctx.profiler.region("moe"):
            x, g, h = self.mlp_hc.mix(h, inject=(y, g))  # h + y ⊗ g, added in the mix's first launch
            assert g is not None
            host = ctx.batch.host
            return HyperConnection.inject(h, self.mlp(x, num_decode=host.num_decode, num_padding=host.num_padding), g)


def build(
    arch: Qwen4ExpArch, params: Params, executor: MoEExecutor, device: torch.device, ple_store: PleStore | None = None,
    embed: Callable[[torch.Tensor], torch.Tensor] | None = None, linear: Linear = dense_gemv_ref,
) -> CausalLM:
    """The model on `device`; `ple_store` holds the PLE tables (required when the arch has
    PLE layers); `embed`: a host-resident embedding (`--embed-weights host`; `params` then
    has no "embed"); `linear`: the dense projections' kernel (--dense-kernel), every one's:
    GDN, QSA attention and its indexer, PLE, hyper-connections, routers, the LM head."""
    if arch.ple is not None and ple_store is None:
        raise ValueError("qwen4_exp with PLE layers needs a PLE store (--ple-store)")
    p = to_device(arch, params, device)
    eps, hc = arch.rms_norm_eps, arch.hc_count
    rotary = Rotary(arch.rope, device)
    rope = RopeTable(*rotary.cos_sin_table(arch.max_position_embeddings))
    kernels = gdn_kernels("auto", device)
    kv_index = {layer: j for j, layer in enumerate(arch.kv_layers)}
    gdn_index = {layer: j for j, layer in enumerate(arch.gdn_layers)}
    blocks = []
    for i in range(arch.num_layers):
        pre = f"layers.{i}."

        def hyper(name: str, pre: str = pre) -> HyperConnection:
            return HyperConnection(p[pre + name + "norm"], p[pre + name + "down"], p[pre + name + "up"], hc, eps,
                                   linear)

        mixer: Mixer
        if i in gdn_index:
            spec = GdnSpec(gdn_index[i], arch.linear_num_key_heads, arch.linear_num_value_heads,
                           arch.linear_key_head_dim, arch.linear_value_head_dim, eps, arch.output_gate)
            mixer = GatedDeltaNet(spec, p[pre + "in_proj"], p[pre + "conv"][:, 0], p[pre + "A_log"],
                                  p[pre + "dt_bias"], p[pre + "gdn_norm"], p[pre + "out_proj"], kernels, linear)
        else:
            mixer = _indexed(arch, kv_index[i], pre, p, rope, linear)
        ple = _ple(arch, i, pre, p, linear) if i in arch.ple_layers else None
        blocks.append(Qwen4Block(mixer, hyper("hc_attn_"), _mlp(arch, i, p, executor, linear), hyper("hc_mlp_"), ple,
                                 "gdn" if i in gdn_index else "attention"))
    final = HyperConnection(p["mixer_norm"], p["mixer_down"], p["mixer_up"], hc, eps, linear)
    hook = None
    if arch.ple is not None:
        assert ple_store is not None
        inputs = PleInputs(arch.ple, ple_store, device)

        def hook(ctx: StepContext) -> StepContext:
            return dataclasses.replace(ctx, ple=inputs.step(ctx))

    return CausalLM(arch, p["embed"] if embed is None else embed, blocks, lambda h: final.mix(h)[0], p["lm_head"],
                    rotary, streams=hc, step_hook=hook, linear=linear)


def _indexed(arch: Qwen4ExpArch, layer: int, pre: str, p: Params, rope: RopeTable, linear: Linear) -> QsaAttention:
    assert arch.qsa is not None
    eps, q = arch.rms_norm_eps, arch.qsa
    spec = AttentionSpec(layer=layer, num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads,
                         head_dim=arch.head_dim, scale=arch.head_dim**-0.5, rope=rope)
    return QsaAttention(
        spec, p[pre + "qkv"], p[pre + "o_proj"], OffsetRMSNorm(p[pre + "q_norm"], eps),
        OffsetRMSNorm(p[pre + "k_norm"], eps), QsaSpec(q.num_heads, q.head_dim, q.ratio, q.block_topk),
        p[pre + "idx_qk"], OffsetRMSNorm(p[pre + "idx_q_norm"], eps), OffsetRMSNorm(p[pre + "idx_k_norm"], eps),
        linear,
    )


def _ple(arch: Qwen4ExpArch, i: int, pre: str, p: Params, linear: Linear) -> PleLayer:
    assert arch.ple is not None
    eps = arch.rms_norm_eps
    return PleLayer(arch.ple_layers.index(i), p[pre + "ple_key"], p[pre + "ple_value"], p[pre + "ple_norm_key"],
                    p[pre + "ple_norm_query"], p[pre + "ple_norm_conv"], p[pre + "ple_conv"][:, 0],
                    arch.ple.ngram_size, eps, PLE_CONV, linear=linear)
