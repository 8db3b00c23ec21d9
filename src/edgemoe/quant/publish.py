"""Our expert parts → tensors and `quantization_config` in the standard layouts, so other
tools load what `edgemoe convert` writes, and `published.py` reads it back losslessly.

- fp8: Qwen3 `*-FP8` — "X.weight" e4m3, "X.weight_scale_inv" fp32 blocks;
- int8: compressed-tensors "pack-quantized", 8 bits per channel (W8A16) — "X.weight_packed"
  int32 [N, K/4] (byte i of word j: q + 128 of input 4j + i), "X.weight_scale" [N, 1],
  "X.weight_shape": the layout transformers decompresses MoE experts from ("int-quantized"
  int8 experts it cannot stack);
- int4: compressed-tensors "pack-quantized" — "X.weight_packed" int32 [N, K/8] (nibble i of
  word j: q + 8 of input 8j + i), "X.weight_scale" [N, K/g], "X.weight_shape", and
  "X.weight_zero_point" (packed along N) only when a zero point differs from 8. One
  `group_size` g must divide every expert matrix's K (compressed-tensors checks it):
  `shared_group` picks it, and a group of ours spanning several is written as several;
- mxfp4: gpt-oss — all experts of a layer in "<p>.experts.gate_up_proj_blocks"
  [E, N, K/32, 16] / "_scales" [E, N, K/32] (gate rows first), "down_proj_…" likewise.
Scales keep our dtype (fp32 / fp16), so a round trip through the files is exact.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from edgemoe.quant.formats import ExpertFormat, Parts
from edgemoe.quant.fp8 import Fp8Block
from edgemoe.quant.int4 import Int4Group, unpack_nibbles
from edgemoe.quant.int8 import Int8Channel
from edgemoe.quant.mxfp4 import Mxfp4


def pack_int32(values: torch.Tensor, dim: int, bits: int = 4) -> torch.Tensor:
    """Unsigned `bits`-bit values (4 or 8) → int32 with 32/bits per word along `dim` (value
    per·j + i in field i of word j; the dimension zero-padded to a multiple of per)."""
    per = 32 // bits
    v = values.to(torch.int64).movedim(dim, -1)
    pad = -v.shape[-1] % per
    v = torch.nn.functional.pad(v, (0, pad)).reshape(*v.shape[:-1], -1, per)
    word = (v << torch.arange(0, 32, bits)).sum(-1)
    word = torch.where(word >= 2**31, word - 2**32, word)  # the bit pattern as a signed int32
    return word.to(torch.int32).movedim(-1, dim).contiguous()


def shared_group(fmt: ExpertFormat, dims: tuple[int, ...]) -> int:
    """The int4 `group_size` to publish: the largest divisor of our group that divides every
    expert matrix's K (`dims`: hidden and intermediate size), so each published group lies
    inside one of ours; our group itself for every published shape."""
    assert isinstance(fmt, Int4Group)
    return math.gcd(fmt.group, *dims)


def encode_linear(fmt: ExpertFormat, base: str, parts: Parts, shape: tuple[int, int],
                  group: int = 0) -> dict[str, torch.Tensor]:
    """One matrix's parts (by suffix) → checkpoint tensors for "X.weight" = `base`;
    `group`: int4's published group (`shared_group`), ours when 0."""
    stem = base.removesuffix(".weight")
    n, k = shape
    if isinstance(fmt, Fp8Block):
        return {base: parts[""], f"{stem}.weight_scale_inv": parts["_scale"]}
    if isinstance(fmt, Int8Channel):
        q = (parts[""].to(torch.int16) + 128).to(torch.uint8)
        return {f"{stem}.weight_packed": pack_int32(q, 1, bits=8), f"{stem}.weight_scale": parts["_scale"],
                f"{stem}.weight_shape": torch.tensor([n, k])}
    if isinstance(fmt, Int4Group):
        g = group or fmt.group
        ours = torch.arange(math.ceil(k / g)) * g // fmt.group  # each published group's group of ours

        def regroup(t: torch.Tensor) -> torch.Tensor:
            return t[:, ours].contiguous()

        out = {f"{stem}.weight_packed": pack_int32(unpack_nibbles(parts[""], k), 1),
               f"{stem}.weight_scale": regroup(parts["_scale"]), f"{stem}.weight_shape": torch.tensor([n, k])}
        zero = parts["_zero"]
        if (zero != 8).any():
            if (zero > 15).any():
                raise ValueError(f"{base}: a zero point of 16 (GPTQ v1) has no 4-bit encoding")
            out[f"{stem}.weight_zero_point"] = pack_int32(regroup(zero), 0)
        return out
    raise ValueError(f"{fmt.label}: no per-linear checkpoint layout (mxfp4 is written per layer)")


def encode_fused_mxfp4(prefix: str, gate_up: Parts, down: Parts) -> dict[str, torch.Tensor]:
    """A layer's mxfp4 banks ([E, N, K/2] data, [E, N, K/32] scales) → gpt-oss tensors."""
    out = {}
    for proj, parts in (("gate_up_proj", gate_up), ("down_proj", down)):
        e, n, g = parts["_scale"].shape
        out[f"{prefix}.experts.{proj}_blocks"] = parts[""].reshape(e, n, g, 16)
        out[f"{prefix}.experts.{proj}_scales"] = parts["_scale"]
    return out


def quantization_config(fmt: ExpertFormat, unquantised: list[str], asymmetric: bool = False,
                        group: int = 0) -> dict[str, Any] | None:
    """config.json's `quantization_config` for experts in `fmt`; `unquantised`: the modules
    (linears by name, e.g. "model.layers.0.self_attn.q_proj") left in the model dtype;
    `group`: int4's published group (ours when 0)."""
    if isinstance(fmt, Fp8Block):
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [fmt.block, fmt.block], "modules_to_not_convert": unquantised}
    if isinstance(fmt, Mxfp4):
        return {"quant_method": "mxfp4", "modules_to_not_convert": unquantised}
    if isinstance(fmt, Int8Channel | Int4Group):
        int4 = isinstance(fmt, Int4Group)
        weights = {"num_bits": 4 if int4 else 8, "type": "int", "symmetric": not asymmetric,
                   "strategy": "group" if int4 else "channel",
                   "group_size": (group or fmt.group) if int4 else None,  # type: ignore[union-attr]
                   "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax"}
        scheme = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed", "config_groups": {"group_0": scheme},
                "ignore": unquantised, "kv_cache_scheme": None}
    return None


def shard_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(math.prod(t.shape) * t.element_size() for t in tensors.values())
