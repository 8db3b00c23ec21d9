"""The GDN leaf kernels composed into one Qwen3.5 GDN layer (projections, conv, gates, rule,
gated norm) over a varlen batch with pools, against transformers' `Qwen3_5MoeGatedDeltaNet`
run per sequence with its own cache: prefill, a continued prefill, then decode steps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gdn_support import EPS32
from transformers import DynamicCache
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (
    Qwen3_5MoeTextConfig,
)
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

from edgemoe.kernels.causal_conv import (
    causal_conv1d_update_ref,
    causal_conv1d_varlen_ref,
)
from edgemoe.kernels.gated_norm import gated_rms_norm_ref
from edgemoe.kernels.gdn import (
    chunk_gated_delta_rule_ref,
    gdn_gates,
    recurrent_gated_delta_rule_ref,
)

HIDDEN, HK, HV, DK, DV = 32, 2, 4, 16, 8


def make_layer() -> tuple[Qwen3_5MoeTextConfig, Qwen3_5MoeGatedDeltaNet]:
    config = Qwen3_5MoeTextConfig(
        hidden_size=HIDDEN, linear_num_key_heads=HK, linear_num_value_heads=HV, linear_key_head_dim=DK,
        linear_value_head_dim=DV, num_hidden_layers=1, layer_types=["linear_attention"],
    )
    torch.manual_seed(0)
    layer = Qwen3_5MoeGatedDeltaNet(config, 0).eval()
    with torch.no_grad():
        layer.dt_bias.normal_()
        layer.norm.weight.normal_(1.0, 0.2)
    return config, layer


def layer_atol(layer: Qwen3_5MoeGatedDeltaNet, h: torch.Tensor, seq_len: int) -> float:
    """Two fp32 evaluations of the layer differ by ≤ 2·γ_n·M: n the longest chain of rounded
    accumulations (conv K taps, the rule's seq_len state updates and Dk dot product, the norm's DV
    squares, out_proj's HV·DV terms), M bounds out_proj's terms: its largest absolute row sum times
    the largest normed entry (an RMS-normed entry is ≤ √DV, times |w_norm|, times |silu(z)|)."""
    n = layer.conv_kernel_size + seq_len + DK + DV + HV * DV
    z = F.linear(h, layer.in_proj_z.weight)
    normed = DV**0.5 * layer.norm.weight.abs().max() * F.silu(z).abs().max()
    return 2 * n * EPS32 * (layer.out_proj.weight.abs().sum(-1).max() * normed).item()


def ours(layer: Qwen3_5MoeGatedDeltaNet, h: torch.Tensor, lens: list[int], pools, rows: torch.Tensor,  # noqa: ANN001
         first: bool) -> torch.Tensor:
    """What a model file does with the kernels: h [T, hidden] of len(lens) sequences."""
    conv_pool, state_pool = pools
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    has_state = torch.full((len(lens),), not first)
    qkv = F.linear(h, layer.in_proj_qkv.weight)
    conv_w = layer.conv1d.weight[:, 0]
    if len(lens) == h.shape[0] and not first:  # one token each: the decode forms
        qkv = causal_conv1d_update_ref(qkv, conv_w, None, conv_pool, rows)
        rule = recurrent_gated_delta_rule_ref
    else:
        qkv = causal_conv1d_varlen_ref(qkv, conv_w, None, conv_pool, rows, cu, has_initial_state=has_state)
        rule = chunk_gated_delta_rule_ref
    q, k, v = qkv.split([HK * DK, HK * DK, HV * DV], dim=-1)
    gates = gdn_gates(F.linear(h, layer.in_proj_a.weight), F.linear(h, layer.in_proj_b.weight), layer.A_log,
                      layer.dt_bias)
    o = rule(q.view(-1, HK, DK), k.view(-1, HK, DK), v.view(-1, HV, DV), gates.g, gates.beta, cu, state_pool, rows,
             has_initial_state=has_state, use_qk_l2norm=True)
    z = F.linear(h, layer.in_proj_z.weight).view(-1, HV, DV)
    o = gated_rms_norm_ref(o, z, layer.norm.weight, layer.layer_norm_epsilon)
    return F.linear(o.reshape(h.shape[0], -1), layer.out_proj.weight)


def test_layer_prefill_continue_decode_matches_transformers() -> None:
    config, layer = make_layer()
    steps = [[70, 2], [5, 64], [1, 1], [1, 1]]  # per sequence: prefill, continued prefill, 2 decodes
    total = [sum(s[i] for s in steps) for i in range(2)]
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randn(n, HIDDEN, generator=gen) for n in total]
    rows = torch.tensor([3, 1])
    pools = (torch.full((4, 2 * HK * DK + HV * DV, 3), float("nan")), torch.full((4, HV, DK, DV), float("nan")))
    caches = [DynamicCache(config=config) for _ in seqs]
    done = [0, 0]
    with torch.no_grad():
        for step, lens in enumerate(steps):
            parts = [seqs[i][done[i] : done[i] + n] for i, n in enumerate(lens)]
            got = ours(layer, torch.cat(parts), lens, pools, rows, first=step == 0).split(lens)
            for i, part in enumerate(parts):
                want = layer(part[None], cache=caches[i])[0]
                torch.testing.assert_close(got[i], want, rtol=0, atol=layer_atol(layer, part, total[i]))
                done[i] += lens[i]
    assert pools[0][[0, 2]].isnan().all() and pools[1][[0, 2]].isnan().all()
