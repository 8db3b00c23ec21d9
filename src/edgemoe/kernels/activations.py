"""Activations by the name a config's `hidden_act` gives: a callable for the torch
paths that also carries the name the fast kernels dispatch on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Activation:
    kernel_name: str  # what the Triton kernels call it: silu | gelu | gelu_tanh
    fn: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


ACTIVATIONS: dict[str, Activation] = {
    "silu": Activation("silu", F.silu),
    "swish": Activation("silu", F.silu),  # transformers' ACT2FN: another name of SiLU
    "gelu": Activation("gelu", F.gelu),
    "gelu_pytorch_tanh": Activation("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
}


def activation(name: str) -> Activation:
    """The activation `hidden_act` names; ValueError naming the supported ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def kernel_name(act: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """The fast kernels' name for `act`, or None for a plain function (torch path only)."""
    return act.kernel_name if isinstance(act, Activation) else None
