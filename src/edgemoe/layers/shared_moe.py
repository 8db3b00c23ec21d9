"""A sparse MoE block with a shared expert (Qwen3-Next, Qwen3.5; GLM's wider ones, ungated):

    y = sum_k w_k · expert_{id_k}(x) + sigmoid(x · g_shared) · shared(x)     (gated)
    y = sum_k w_k · expert_{id_k}(x) + shared(x)                            (ungated: GLM)

When the shared expert has the routed experts' shape, it is expert E of the layer's bank
in the expert store (the loader puts it there): every token routes to it as one more
(token, k) pair with weight sigmoid(x · g_shared), through the same slot-addressed
executor call as the routed experts. So it is cached, offloaded and computed on the CPU
like any expert (an LRU keeps it resident: every token uses it), and the fixed-order k-sum
covers it. A shared expert of another width cannot share the banks: it runs as a dense
MLP on the device and is added after the routed sum. GLM's are ungated: one of the routed
width is the bank's last pair of weight 1 in a plain `SparseMoE` (`models/glm4_moe.py`);
a wider one (`n_shared_experts` > 1) is this block's dense MLP, added unscaled.
"""

from __future__ import annotations

import torch

from edgemoe.kernels.shared_gate import append_shared
from edgemoe.layers.mlp import DenseMLP
from edgemoe.layers.moe import SparseMoE


class SharedExpertMoE:
    def __init__(
        self,
        routed: SparseMoE,
        shared_gate: torch.Tensor | None,  # [1, H]; None: ungated (weight 1), dense only
        shared_id: int | None,  # the shared expert's id in the bank (E), or None when dense
        shared_mlp: DenseMLP | None = None,  # the shared expert when it is not in the bank
    ) -> None:
        if (shared_id is None) == (shared_mlp is None):
            raise ValueError("the shared expert is either in the bank (shared_id) or dense (shared_mlp)")
        if shared_gate is None and shared_mlp is None:
            raise ValueError("an ungated shared expert runs as a dense MLP (shared_mlp)")
        self.routed, self.shared_gate, self.shared_id, self.shared_mlp = routed, shared_gate, shared_id, shared_mlp
        self.linear = routed.linear  # the routed block's kernel choice (--dense-kernel)

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, num_decode: int = 0, num_padding: int = 0,
        routing: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """[T, H] → [T, H] (plus `residual`, fused, when given); `num_decode` / `num_padding`
        as for `SparseMoE`; `routing`: the routed (ids, weights) of x when the block already
        has them (`SparseMoE.add_norm_route`)."""
        moe = self.routed
        ids, weights = moe.route(x) if routing is None else routing  # [T, K] int32, fp32 weights of x-dtype values
        if self.shared_id is not None:  # [T, K+1]: the shared pair last (one launch on a GPU)
            ids, weights = append_shared(x, self.shared_gate, ids, weights, self.shared_id, self.linear)
            return moe.executor.forward(moe.layer, x, ids, weights, residual, num_decode, num_padding)
        assert self.shared_mlp is not None
        out = moe.executor.forward(moe.layer, x, ids, weights, None, num_decode, num_padding)
        if self.shared_gate is None:
            out = out + self.shared_mlp(x)
        else:
            gate = torch.sigmoid(self.linear(x, self.shared_gate))  # [T, 1] in x's dtype, as transformers
            out = out + gate * self.shared_mlp(x)
        return out if residual is None else residual + out
