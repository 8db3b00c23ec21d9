"""quantization_config settings beyond the common ones, found by sweeping each format's
options against its tools' own output (compressed-tensors' compressors) or the format's
definition: each test fails on the loader before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from quant_ckpt_support import _pack_cols, write_int4
from safetensors.torch import load_file, save_file

from edgemoe import LLM
from edgemoe.assets.checkpoint import model_config
from edgemoe.models.checkpoint_files import CheckpointError
from edgemoe.quant import Int4Group, Int8Channel
from edgemoe.quant.published import QuantConfigError
from edgemoe.quant.published_config import scheme_for


def _ct(weights: dict, fmt: str = "pack-quantized", **groups: dict):  # noqa: ANN202
    config_groups = groups or {"group_0": {"targets": ["Linear"], "weights": weights}}
    return scheme_for({"quantization_config": {"quant_method": "compressed-tensors", "format": fmt,
                                               "config_groups": config_groups}})


def _pack8(v: torch.Tensor, dim: int) -> torch.Tensor:
    """Values 0..255 → int32, four a word along `dim` (byte i of word j: position 4j + i)."""
    u = v.long().movedim(dim, -1)
    u = u.reshape(*u.shape[:-1], -1, 4)
    return sum(u[..., i] << (8 * i) for i in range(4)).to(torch.int32).movedim(-1, dim)


@pytest.mark.parametrize("symmetric", [False, True])
def test_compressed_tensors_int4_zero_points_as_older_versions_stored_them(symmetric: bool) -> None:
    """Before compressed-tensors PR #296 (2025-04) the zero point was the module's own int8
    [N, G], signed and unpacked (and before PR #59, 2024-05, symmetric checkpoints kept theirs,
    all 0). Read as packed words it gave garbage of the right shape: a silently wrong model."""
    scheme = _ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": symmetric})
    g = torch.Generator().manual_seed(11)
    n, k = 16, 64
    q = torch.randint(-8, 8, (n, k), generator=g)
    s = (torch.rand(n, 2, generator=g) + 0.5).half().float()  # ours are fp16: exact
    z = torch.randint(-8, 8, (n, 2), generator=g) if not symmetric else torch.zeros(n, 2, dtype=torch.long)
    want = torch.stack([(q[:, c] - z[:, c // 32]) * s[:, c // 32] for c in range(k)], dim=1)
    parts = {"weight_packed": _pack_cols(q + 8, list(range(8))), "weight_scale": s,
             "weight_shape": torch.tensor([n, k])}
    for zp in (z.to(torch.int8), _pack_cols((z + 8).T.contiguous(), list(range(8))).T.contiguous()):  # old, new
        fmt, ours = scheme.decode(parts | {"weight_zero_point": zp})
        assert fmt == Int4Group(32)
        assert torch.equal(fmt.dequantise(ours, n, k), want)


@pytest.mark.parametrize("strategy", ["group", "channel"])
def test_compressed_tensors_int8_zero_points_old_and_new(strategy: str) -> None:
    """pack-quantized int8 with zero points, by group or (now loaded, was refused)
    asymmetric by channel: the packed zero points and the older unpacked int8 ones."""
    w = {"num_bits": 8, "type": "int", "strategy": strategy, "symmetric": False}
    scheme = _ct(w | ({"group_size": 32} if strategy == "group" else {}))
    assert scheme.format == Int8Channel()
    g = torch.Generator().manual_seed(12)
    n, k, groups = 8, 64, 2 if strategy == "group" else 1
    q = torch.randint(-128, 128, (n, k), generator=g)
    s = torch.rand(n, groups, generator=g) + 0.5
    z = torch.randint(-20, 20, (n, groups), generator=g)
    width = k // groups
    want = torch.stack([s[:, c // width] * (q[:, c] - z[:, c // width]) for c in range(k)], dim=1)
    parts = {"weight_packed": _pack8(q + 128, 1), "weight_scale": s, "weight_shape": torch.tensor([n, k])}
    for zp in (z.to(torch.int8), _pack8(z + 128, 0)):  # old, new
        assert torch.equal(scheme.decode(parts | {"weight_zero_point": zp}), want)


def test_compressed_tensors_groups_that_differ_only_in_targets_are_one_scheme() -> None:
    w4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "observer": "minmax"}
    scheme = _ct({}, group_0={"targets": ["re:.*self_attn.*"], "weights": w4},
                 group_1={"targets": ["re:.*mlp.experts.*"], "weights": w4 | {"observer": "mse", "symmetric": True}})
    assert scheme.format == Int4Group(32)
    with pytest.raises(QuantConfigError, match=r"config_groups \['group_0', 'group_1'\].*2 different layouts"):
        _ct({}, group_0={"targets": ["re:.*self_attn.*"], "weights": w4},
            group_1={"targets": ["re:.*experts.*"], "weights": w4 | {"group_size": 128}})


def test_compressed_tensors_refusals_name_what_is_refused() -> None:
    """Asymmetric int-quantized int8 and fp8 with a zero point (which no fp8 scheme of ours
    reads: it was ignored) are refused, saying `symmetric: false`."""
    with pytest.raises(QuantConfigError, match=r"int channel asymmetric \(symmetric: false\)"):
        _ct({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": False}, "int-quantized")
    for strategy in ("tensor", "channel", "block"):
        w = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": False, "block_structure": [32, 32]}
        with pytest.raises(QuantConfigError, match=r"symmetric: false"):
            _ct(w, "float-quantized")


# ---- GPTQ as gptqmodel writes it (2026-12 audit) ----


def _words(v: torch.Tensor, dim: int, bits: int) -> torch.Tensor:
    """Unsigned `bits`-bit values → the int64 words (0 .. 2^32 − 1) packing them 32/bits a word
    along `dim`, field i of word j holding position 32/bits·j + i (GPTQ's qweight and qzeros)."""
    per = 32 // bits
    u = v.long().movedim(dim, -1)
    u = u.reshape(*u.shape[:-1], -1, per)
    return sum(u[..., i] << (bits * i) for i in range(per)).movedim(-1, dim).contiguous()


def _i32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # as the packers' int32 holds them


def _gptq(bits: int, group: int, layout: str = "gptq_v2") -> Any:  # noqa: ANN401
    return scheme_for({"quantization_config": {"quant_method": "gptq", "bits": bits, "group_size": group,
                                               "sym": False, "desc_act": False, "checkpoint_format": layout}})


def _dense(out: Any, n: int, k: int) -> torch.Tensor:  # noqa: ANN401
    return out if isinstance(out, torch.Tensor) else out[0].dequantise(out[1], n, k)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_v1_zero_points_of_zero_are_read_as_gptqmodel_writes_them(bits: int) -> None:
    """gptqmodel writes `checkpoint_format: gptq` (v1) by subtracting 0x11111111 (8 bits:
    0x01010101) from each packed qzeros word, so an asymmetric group's zero of 0 borrows
    from the next field, and reads it back by adding the word (utils/model.py:
    convert_gptq_v2_to_v1_format_module / convert_gptq_v1_to_v2_format_module).
    was: +1 field by field read that zero as 2^bits and its neighbour's one low: weights off
    by up to 2^bits steps, no error (logits off by 24 on a scale of 14 in a tiny Qwen3-MoE)."""
    g = torch.Generator().manual_seed(bits)
    n, k, group, maxq = 32, 128, 32, (1 << bits) - 1
    q = torch.randint(0, maxq + 1, (k, n), generator=g)
    z = torch.randint(0, maxq + 1, (k // group, n), generator=g)
    z[:, ::3] = 0  # groups with no negative weight: min-max gives a zero point of 0
    s = (torch.rand(k // group, n, generator=g) + 0.5).half()
    want = (s.float()[torch.arange(k) // group] * (q - z[torch.arange(k) // group]).float()).T
    ones = sum(1 << (bits * i) for i in range(32 // bits))
    v1 = _i32((_words(z, 1, bits) - ones) % 2**32)  # gptqmodel's v2 → v1, word by word
    parts = {"qweight": _i32(_words(q, 0, bits)), "scales": s, "g_idx": (torch.arange(k) // group).int()}
    assert torch.equal(_dense(_gptq(bits, group, "gptq").decode(parts | {"qzeros": v1}), n, k), want)
    assert torch.equal(_dense(_gptq(bits, group).decode(parts | {"qzeros": _i32(_words(z, 1, bits))}), n, k), want)


@pytest.mark.parametrize(("linear_bits", "config_bits"), [(8, 4), (4, 8)])
def test_gptq_linear_width_without_g_idx_is_read_off_its_zero_points(linear_bits: int, config_bits: int) -> None:
    """A per-layer width (gptqmodel `dynamic`, AutoRound `extra_config`) with one group a row
    and no g_idx: the rows don't tell the width, qzeros [1, N·bits/32] beside scales [1, N]
    does. was: read at the config's width, refused with a shape error."""
    g = torch.Generator().manual_seed(linear_bits)
    n, k, maxq = 64, 64, (1 << linear_bits) - 1
    q = torch.randint(0, maxq + 1, (k, n), generator=g)
    z = torch.randint(0, maxq + 1, (1, n), generator=g)
    s = (torch.rand(1, n, generator=g) + 0.5).half()
    parts = {"qweight": _i32(_words(q, 0, linear_bits)), "qzeros": _i32(_words(z, 1, linear_bits)), "scales": s}
    assert torch.equal(_dense(_gptq(config_bits, -1).decode(parts), n, k), (s.float() * (q - z).float()).T)


def test_a_quantised_linear_decoded_to_another_width_is_refused(tmp_path: Path) -> None:
    """Dequantising reads K off the model's tensor, so a packed linear of another width was
    cut to fit (int4: the first K of its inputs), silently; a plain tensor's shape is checked."""
    config = model_config("qwen3_moe", num_hidden_layers=1, vocab_size=512)
    ckpt, _ = write_int4(config, tmp_path / "q", tmp_path / "dense", "gptq")
    base = "model.layers.0.self_attn.q_proj"
    for f in sorted(ckpt.glob("*.safetensors")):
        t = load_file(str(f))
        if f"{base}.qweight" in t:  # this linear packed for twice its inputs (its parts agree with each other)
            n, k = t[f"{base}.scales"].shape[1], 2 * t[f"{base}.g_idx"].numel()
            t[f"{base}.qweight"] = torch.cat([t[f"{base}.qweight"]] * 2)
            t[f"{base}.qzeros"] = torch.cat([t[f"{base}.qzeros"]] * 2)
            t[f"{base}.scales"] = torch.cat([t[f"{base}.scales"]] * 2)
            t[f"{base}.g_idx"] = (torch.arange(k) // 32).int()
            save_file(t, str(f), metadata={"format": "pt"})
            assert n == 64
    with pytest.raises(CheckpointError, match=r"self_attn\.q_proj: decoded as int4 \(group 32\).*shape \(64, 64\)"):
        LLM(str(ckpt), dtype="float32")
