"""quantization_config settings beyond the common ones, found by sweeping each format's
options against its tools' own output (compressed-tensors' compressors) or the format's
definition: each test fails on the loader before its fix."""

from __future__ import annotations

import pytest
import torch
from quant_ckpt_support import _pack_cols

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
