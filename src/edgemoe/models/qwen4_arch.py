"""Qwen4ExpArch: the shape of Qwen3.8-Flash-Next (`qwen4_exp`), read from config.json.

The Qwen3.5 hybrid layout (gated-delta-net "linear_attention" layers, attention layers,
every layer a sparse MoE with a shared expert) with four differences (transformers 5.24's
`modeling_qwen4_exp.py`):

- the attention layers are "indexed": a QSA indexer picks, per query, the top
  budget/ratio compressed key blocks plus the incomplete tail (`kernels/qsa.py`); its
  keys are one more per-slot tensor of the KV pool (`index_key_dim`);
- hyper-connections: the residual stream is `hc_count` streams [T, hc·H]; no input /
  post-attention / final norms (each block reads a low-rank mix, a final mixer feeds the
  LM head);
- per-layer embeddings (PLE) on the GDN layers `ple_layer_ids` (one-indexed): hashed
  n-gram tables (`ple/geometry.py`) far larger than the rest of the model, kept out of
  `param_shapes` (`table_shapes`: the PLE store holds them);
- per sequence, besides the GDN state: its n-gram context and each PLE layer's dilated
  conv state (`RowState` extras of the state pool, so prefix-cache snapshots carry them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from edgemoe.cache.state_pool import RowState, StateShape
from edgemoe.models.arch import ConfigError, HFConfig
from edgemoe.models.hybrid_arch import ATTENTION, GDN, HybridArch, hybrid_arch
from edgemoe.ple.geometry import PleGeometry, ple_geometry

INDEXED = "indexed_attention"  # transformers' name for the attention layers (config may say full_attention)
NGRAM_CTX, PLE_CONV = "ngram_ctx", "ple_conv"  # the state pool extras


@dataclass(frozen=True)
class QsaConfig:
    num_heads: int  # indexer query heads (one key head)
    head_dim: int
    budget: int  # tokens of complete blocks a query may select
    ratio: int  # tokens per compressed block

    @property
    def block_topk(self) -> int:
        return self.budget // self.ratio

    @property
    def max_selected(self) -> int:
        """Tokens a query attends to at most: its blocks and the incomplete tail."""
        return self.budget + self.ratio - 1


@dataclass(frozen=True)
class Qwen4ExpArch(HybridArch):
    hc_count: int
    hc_lowrank: int
    ple_layers: tuple[int, ...]  # zero-indexed GDN layers with a PLE module
    ple: PleGeometry | None  # None when no layer has PLE
    ple_conv_kernel: int
    qsa: QsaConfig | None  # None when no layer attends
    output_gate: str  # the GDN output gate's activation: silu or sigmoid

    @property
    def hc_width(self) -> int:
        return self.hc_count * self.hidden_size

    @property
    def ple_conv_history(self) -> int:
        """Inputs the dilated PLE conv keeps per channel: (K - 1) · dilation (dilation = ngram_size)."""
        return (self.ple_conv_kernel - 1) * (self.ple.ngram_size if self.ple else 1)

    @property
    def index_key_dim(self) -> int:
        return self.qsa.head_dim if self.qsa else 0

    @property
    def projection_width(self) -> int:
        qsa = (self.qsa.num_heads + 1) * self.qsa.head_dim if self.qsa else 0
        return max(super().projection_width + qsa, 2 * self.hc_width + self.hc_lowrank)

    def workspace_rows(self, max_running: int, max_len: int) -> list[tuple[str, int]]:
        """QSA selection, per attention layer call (freed between layers): decode scores every
        block the page table can hold for each running sequence and gathers its selected
        tokens' K/V; a prompt chunk runs in query tiles of at most `TILE_BYTES`."""
        if self.qsa is None:
            return []
        q, size = self.qsa, self.dtype.itemsize
        blocks = -(-max_len // q.ratio)
        per_seq = blocks * (q.head_dim * size + 4 * (q.num_heads + 3)) + q.max_selected * (
            2 * self.num_kv_heads * self.head_dim * size + 4 * self.num_heads)
        from edgemoe.layers.qsa_attention import TILE_BYTES

        prompt = TILE_BYTES + blocks * (q.head_dim * size + 4 * (q.num_heads + 3))
        return [("QSA selection workspace", max(max_running * per_seq, prompt))]

    def state_shape(self) -> StateShape:
        extras: tuple[RowState, ...] = ()
        if self.ple is not None:
            extras = (
                RowState(NGRAM_CTX, (self.ple.context,), torch.int64),
                RowState(PLE_CONV, (len(self.ple_layers), self.hc_width, self.ple_conv_history), self.dtype),
            )
        return super().state_shape()._replace(extras=extras)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Our names and shapes of every tensor not in the expert store or a PLE table."""
        H, W, R = self.hidden_size, self.hc_width, self.hc_lowrank
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab_size, H)}
        if not self.tie_word_embeddings:
            shapes["lm_head"] = (self.vocab_size, H)
        shapes |= {"mixer_norm": (W,), "mixer_down": (R, W), "mixer_up": (W, R)}
        for i in range(self.num_layers):
            p = f"layers.{i}."
            for hc in ("hc_attn_", "hc_mlp_"):  # down rows then the hc inject rows: one GEMM
                shapes |= {p + hc + "norm": (W,), p + hc + "down": (R + self.hc_count, W), p + hc + "up": (W, R)}
            mixer = self._gdn_shapes() if i in self.gdn_layers else self._attn_shapes()
            shapes |= {p + k: v for k, v in mixer.items()}
            shapes |= {p + k: v for k, v in self._mlp_shapes(i).items()}
            if i in self.ple_layers:
                shapes |= {p + k: v for k, v in self._ple_shapes().items()}
        return shapes

    def _attn_shapes(self) -> dict[str, tuple[int, ...]]:
        assert self.qsa is not None
        q = self.qsa
        return {**super()._attn_shapes(), "idx_qk": ((q.num_heads + 1) * q.head_dim, self.hidden_size),
                "idx_q_norm": (q.head_dim,), "idx_k_norm": (q.head_dim,)}

    def _ple_shapes(self) -> dict[str, tuple[int, ...]]:
        assert self.ple is not None
        W, P = self.hc_width, self.ple.embed_dim
        return {"ple_key": (W, P), "ple_value": (self.hidden_size, P), "ple_norm_key": (W,), "ple_norm_query": (W,),
                "ple_norm_conv": (W,), "ple_conv": (W, 1, self.ple_conv_kernel)}

    def table_shapes(self) -> dict[str, tuple[int, ...]]:
        """The PLE tables by our name (`ple.<j>`, j-th PLE layer): rows × head_dim."""
        if self.ple is None:
            return {}
        return {f"ple.{j}": (g.rows, self.ple.head_dim) for j, g in enumerate(self.ple.layers)}


def qwen4_arch(c: HFConfig, *, model_type: str, checkpoint_prefix: str) -> Qwen4ExpArch:
    """The fields transformers 5.24's `Qwen4ExpTextConfig` reads, with its defaults."""
    layers = c.layers()
    types = c.get("layer_types")
    if isinstance(types, list):  # the real checkpoint says full_attention for the indexed layers
        types = [ATTENTION if t in (INDEXED, ATTENTION) else t for t in types]
    fields = {**c.raw, "layer_types": types} if types is not None else dict(c.raw)
    base = hybrid_arch(
        HFConfig(fields, c.schema), model_type=model_type, checkpoint_prefix=checkpoint_prefix, gdn_layout="split",
        moe_layers=tuple(range(layers)), norm_topk_prob=c.flag("norm_topk_prob", True),
    )
    hc = c.integer("hc_count", 4, minimum=2)
    gate = c.get("output_gate_type") or base.hidden_act
    if gate not in ("silu", "sigmoid"):
        raise ConfigError(f"output_gate_type={gate!r} is not silu or sigmoid")
    ple_layers = tuple(i - 1 for i in sorted(set(c.int_list("ple_layer_ids"))))
    return Qwen4ExpArch(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(HybridArch)},
        hc_count=hc, hc_lowrank=c.integer("hc_lowrank", 320), ple_layers=ple_layers,
        ple=_ple(c, base, ple_layers, model_type), ple_conv_kernel=c.integer("ple_conv_kernel_size", 4, minimum=2),
        qsa=_qsa(c, base, model_type), output_gate=gate,
    )


def _ple(c: HFConfig, base: HybridArch, ple_layers: tuple[int, ...], model_type: str) -> PleGeometry | None:
    if not ple_layers:
        return None
    bad = [i + 1 for i in ple_layers if not 0 <= i < base.num_layers or base.layer_types[i] != GDN]
    if bad:
        raise ConfigError(f"ple_layer_ids {bad} are not linear_attention layers of {model_type}")
    ngram, per = c.integer("ngram_size", 3, minimum=2), c.integer("heads_per_ngram", 8)
    dim = c.integer("ple_embed_dim", base.hidden_size)
    heads = (ngram - 1) * per
    if dim % heads:
        raise ConfigError(f"ple_embed_dim={dim} is not a multiple of the {heads} n-gram heads")
    eos: Any = c.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if not isinstance(eos, int):
        raise ConfigError(f"eos_token_id must be set when ple_layer_ids are ({model_type})")
    return ple_geometry(
        ple_layers=ple_layers, vocab_size=base.vocab_size, ngram_size=ngram, heads_per_ngram=per, embed_dim=dim,
        vocab_base=c.integer("ngram_vocab_size_base", 20_000_000),
        divisor=c.integer("make_ngram_vocab_size_divisible_by", 128),
        seed=c.integer("seed", 1234, minimum=0), split_parts=c.integer("split_ngram_parts", 512), eos=eos,
    )


def _qsa(c: HFConfig, base: HybridArch, model_type: str) -> QsaConfig | None:
    if not base.kv_layers:
        return None
    names = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")
    missing = [n for n in names if c.get(n) is None]
    if missing:  # transformers always builds the indexer on the attention layers
        raise ConfigError(f"the attention layers' QSA indexer of {model_type} needs {', '.join(missing)}")
    values = {n: c.integer(n) for n in names}
    if values["indexer_kv_heads"] != 1:
        raise ConfigError(f"indexer_kv_heads={values['indexer_kv_heads']}: QSA needs 1")
    qsa = QsaConfig(values["indexer_n_heads"], values["indexer_head_dim"], values["indexer_budget"],
                    values["indexer_compress_ratio"])
    if qsa.budget % qsa.ratio:
        raise ConfigError(f"indexer_budget={qsa.budget} is not a multiple of indexer_compress_ratio={qsa.ratio}")
    if base.rope.rotary_dim > qsa.head_dim:
        raise ConfigError(f"the rotary dims ({base.rope.rotary_dim}) must fit the QSA head (indexer_head_dim={qsa.head_dim})")
    return qsa
