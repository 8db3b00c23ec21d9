"""Checkpoints written by transformers' own `save_pretrained` with weights at unit scale, for
tests that compare our loading of them with transformers' (configs, convert)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from edgemoe.testing.checkpoint import write_tokenizer_files


def scale_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Unit-scale activations (transformers' init, std 0.02, makes near-uniform logits that
    would not tell a wrong LM head from a right one): matrices N(0, 1/fan_in), the
    embedding N(0, 1), 1-d weights (norms, zero-centred or not) shifted by N(0, 0.1²).
    The GDN's A_log, dt_bias and conv keep transformers' init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")) or p.dim() == 3 and "conv" in name:
                continue
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                p.add_(0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))


def save(model: torch.nn.Module, out: Path) -> Path:
    """`model` at unit scale, saved by `save_pretrained` with our test tokenizer files."""
    scale_weights(model)
    model.tie_weights()  # re-tie after the rewrite, where the config ties
    model.save_pretrained(out)
    write_tokenizer_files(out)
    return out
