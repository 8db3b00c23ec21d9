"""The pre-norm decoder-only MoE transformer every supported model_type maps onto.

    h = embed(ids)
    for each layer:  h += attn(norm(h));  h += moe_or_mlp(norm(h))
    logits = lm_head(norm(h))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemoe.layers.attention import Attention, AttentionBackend
from edgemoe.layers.batch import ForwardBatch
from edgemoe.layers.mlp import DenseMLP
from edgemoe.layers.moe import SparseMoE
from edgemoe.layers.norm import RMSNorm
from edgemoe.layers.rotary import Rotary
from edgemoe.models.arch import ConfigError, DecoderArch
from edgemoe.moe.executor import MoEExecutor

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def activation(name: str):  # noqa: ANN201 - returns a torch function
    if name not in ACTIVATIONS:
        raise ConfigError(f"hidden_act {name!r} is not supported ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


class DecoderLayer:
    def __init__(self, attn: Attention, attn_norm: RMSNorm, mlp_norm: RMSNorm, mlp: SparseMoE | DenseMLP):
        self.attn, self.attn_norm, self.mlp_norm, self.mlp = attn, attn_norm, mlp_norm, mlp

    def __call__(self, h, cos, sin, batch: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        h = h + self.attn(self.attn_norm(h), cos, sin, batch, backend)
        return h + self.mlp(self.mlp_norm(h))


class MoEDecoder:
    """Holds device tensors built from `params` (our names, see DecoderArch.param_shapes)."""

    def __init__(
        self, arch: DecoderArch, params: dict[str, torch.Tensor], executor: MoEExecutor, device: torch.device
    ) -> None:
        self.arch = arch
        p = {k: v.to(device=device, dtype=arch.dtype) for k, v in params.items()}
        if arch.tie_word_embeddings:
            p["lm_head"] = p["embed"]
        self.embed, self.lm_head = p["embed"], p["lm_head"]
        self.norm = RMSNorm(p["norm"], arch.rms_norm_eps)
        self.rotary = Rotary(arch.rope, device)
        act = activation(arch.hidden_act)
        self.layers = [self._layer(i, p, executor, act) for i in range(arch.num_layers)]

    def _layer(self, i: int, p: dict[str, torch.Tensor], executor: MoEExecutor, act) -> DecoderLayer:  # noqa: ANN001
        a, pre, eps = self.arch, f"layers.{i}.", self.arch.rms_norm_eps
        qn = RMSNorm(p[pre + "q_norm"], eps) if a.qk_norm != "none" else None
        kn = RMSNorm(p[pre + "k_norm"], eps) if a.qk_norm != "none" else None
        attn = Attention(
            i, p[pre + "qkv"], p[pre + "o_proj"], a.num_heads, a.num_kv_heads, a.head_dim,
            qn, kn, a.qk_norm, a.clip_qkv, a.sliding_window,
        )
        if i in a.moe_layers:
            mlp: SparseMoE | DenseMLP = SparseMoE(i, p[pre + "router"], a.top_k, a.norm_topk_prob, executor)
        else:
            mlp = DenseMLP(p[pre + "gate_up"], p[pre + "down"], act)
        return DecoderLayer(attn, RMSNorm(p[pre + "attn_norm"], eps), RMSNorm(p[pre + "mlp_norm"], eps), mlp)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        """Hidden states after the final norm for `batch.logits_indices` rows: [N, H]."""
        h = self.embed[batch.input_ids]  # [T, H]
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, batch, backend)
        return self.norm(h[batch.logits_indices])

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] → [N, V] float32."""
        return F.linear(hidden, self.lm_head).float()
