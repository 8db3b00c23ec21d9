"""Choosing the GDN implementations by name: the references on CPU, fla never imported there."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from edgemoe.kernels.gdn import (
    chunk_gated_delta_rule_ref,
    recurrent_gated_delta_rule_ref,
)
from edgemoe.kernels.gdn_backends import gdn_kernels


@pytest.mark.parametrize("name", ["auto", "torch", "torch+torch"])
def test_cpu_resolves_to_the_references(name: str) -> None:
    kernels = gdn_kernels(name, torch.device("cpu"))
    assert (kernels.prefill, kernels.decode, kernels.name) == (
        chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref, "torch+torch")
    assert "fla" not in sys.modules


@pytest.mark.parametrize("name", ["fla", "fla+triton", "torch+triton", "fla+torch"])
def test_fast_paths_refuse_a_cpu_device(name: str) -> None:
    with pytest.raises(ValueError, match="CUDA"):
        gdn_kernels(name, torch.device("cpu"))


@pytest.mark.parametrize("name", ["cuda", "triton", "triton+triton", "torch+fla+triton"])
def test_unknown_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="gdn backend"):
        gdn_kernels(name, torch.device("cpu"))


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="fla is installed here")
def test_fla_missing_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="fla-core"):
        gdn_kernels("fla", torch.device("cuda"))
