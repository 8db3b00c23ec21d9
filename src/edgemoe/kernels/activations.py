"""Activations of gated MLPs, by the name a config's `hidden_act` gives: GLU-level objects
for the torch paths (`glu(gate, up)`) that also carry what the fast kernels dispatch on
(`kernel_name`, and swiglu_oai's alpha and limit, which the Triton kernels take as
constexprs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Elementwise = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Activation:
    """h = glu(gate, up). With `fn`: fn(gate) * up in the inputs' dtype (each op rounds as
    torch rounds it). Without (swiglu_oai): a GLU of its own, computed in fp32 and rounded
    once to the inputs' dtype."""

    kernel_name: str  # what the Triton kernels call it: silu | gelu | gelu_tanh | swiglu_oai
    fn: Elementwise | None = None
    alpha: float | None = None  # swiglu_oai: h = (clamp(up, ±limit) + 1) · g · sigmoid(alpha · g),
    limit: float | None = None  # g = min(gate, limit)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fn is None:
            raise TypeError(f"{self.kernel_name} acts on (gate, up) together: call .glu(gate, up)")
        return self.fn(x)

    def glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.fn is not None:
            return self.fn(gate) * up
        assert self.alpha is not None and self.limit is not None
        return swiglu_oai(gate, up, self.alpha, self.limit)


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`) in fp32, rounded
    once to gate's dtype (the Triton kernels' rounding point)."""
    g = gate.float().clamp(max=limit)
    u = up.float().clamp(-limit, limit)
    return ((u + 1) * (g * torch.sigmoid(alpha * g))).to(gate.dtype)


def clamped_swiglu(alpha: float, limit: float) -> Activation:
    """gpt-oss's activation for its `swiglu_alpha` (1.702) and `swiglu_limit` (7.0)."""
    return Activation("swiglu_oai", alpha=float(alpha), limit=float(limit))


ACTIVATIONS: dict[str, Activation] = {
    "silu": Activation("silu", F.silu),
    "swish": Activation("silu", F.silu),  # transformers' ACT2FN: another name of SiLU
    "gelu": Activation("gelu", F.gelu),
    "gelu_pytorch_tanh": Activation("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
}
# The kernel entry points' names ("silu", "gelu", "gelu_tanh"; swiglu_oai at gpt-oss's defaults).
BY_KERNEL_NAME: dict[str, Activation] = {
    **{a.kernel_name: a for a in ACTIVATIONS.values()}, "swiglu_oai": clamped_swiglu(1.702, 7.0),
}


def activation(name: str) -> Activation:
    """The activation `hidden_act` names; ValueError naming the supported ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def kernel_name(act: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """The fast kernels' name for `act`, or None for a plain function (torch path only)."""
    return act.kernel_name if isinstance(act, Activation) else None


def kernel_activation(act: str | Activation) -> Activation:
    """What a kernel entry point's `act` names: an Activation as given (its alpha and limit
    travel with it), or a kernel name ("gelu_pytorch_tanh" too)."""
    if isinstance(act, Activation):
        return act
    name = "gelu_tanh" if act == "gelu_pytorch_tanh" else act
    if name not in BY_KERNEL_NAME:
        raise ValueError(f"no MoE kernel activation {act!r} ({', '.join(BY_KERNEL_NAME)})")
    return BY_KERNEL_NAME[name]


def glu(act: Callable[[torch.Tensor], torch.Tensor], gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act's GLU: `act.glu` for an Activation, act(gate) * up for a plain function."""
    return act.glu(gate, up) if isinstance(act, Activation) else act(gate) * up
