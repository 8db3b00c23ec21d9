"""A checkpoint's `quantization_config` → the `Scheme` (quant/published.py) that decodes
its quantised linears: FP8 (`fp8`), AWQ / GPTQ (4 bits; GPTQ 8 too), Intel's AutoRound
(`auto-round`, by its `packing_format`), compressed-tensors (by format, bits, type and
strategy) and gpt-oss MXFP4. Anything else is refused by name."""

from __future__ import annotations

import logging
from typing import Any

from edgemoe.quant.fp8 import Fp8Block
from edgemoe.quant.int4 import Int4Group
from edgemoe.quant.int8 import Int8Channel
from edgemoe.quant.mxfp4 import Mxfp4
from edgemoe.quant.published import (
    AwqScheme,
    Fp8RowScheme,
    Fp8Scheme,
    GptqScheme,
    Int8GroupScheme,
    IntScheme,
    Mxfp4Scheme,
    Packed8Scheme,
    PackedFp4Scheme,
    PackedScheme,
    QuantConfigError,
    Scheme,
)

log = logging.getLogger(__name__)


def scheme_for(config: dict[str, Any]) -> Scheme | None:
    """The scheme of a checkpoint's config.json (None: not quantised)."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise QuantConfigError(f"quantization_config={qc!r}: expected an object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        return _fp8(qc)
    if method in ("awq", "gptq"):
        return _awq_or_gptq(method, qc)
    if method in ("auto-round", "autoround", "intel/auto-round"):
        return _auto_round(qc)
    if method == "compressed-tensors":
        return _compressed(qc)
    if method == "modelopt":
        return _modelopt(qc)
    if method == "mxfp4":
        return Mxfp4Scheme("mxfp4", ("blocks", "scales"), Mxfp4())
    raise QuantConfigError(f"quantization_config quant_method {method!r} is not supported "
                           "(fp8, awq, gptq, auto-round, compressed-tensors, modelopt, mxfp4)")


def _modelopt(qc: dict[str, Any]) -> Scheme | None:
    """NVIDIA ModelOpt (TensorRT Model Optimizer) exports, by `quant_algo`: FP8 (a scale a
    tensor) and FP8_PB_WO (128-blocks), W8A16 (int8, a scale a row), MXFP4 — all lossless;
    FP8_PER_CHANNEL_PER_TOKEN (a scale a row: to int8 rows, as compressed-tensors'
    FP8_DYNAMIC), NVFP4 (e4m3 scales a 16 times `weight_scale_2`: experts into mxfp4).
    Static `input_scale`s are read and ignored: compute is weight-only."""
    algo = str(qc.get("quant_algo") or "").upper()
    if not algo:  # a KV cache export (kv_cache_quant_algo alone): the weights are as they were
        return _weights_unquantised("modelopt")
    if algo == "FP8":
        return Fp8Scheme("modelopt", ("weight", "weight_scale", "input_scale"), Fp8Block(), "weight_scale")
    if algo == "FP8_PB_WO":  # 128x128 blocks, scales [N/128, 1, K/128, 1]
        return Fp8Scheme("modelopt", ("weight", "weight_scale"), Fp8Block(128), "weight_scale")
    if algo == "W8A16":
        return IntScheme("modelopt", ("weight", "weight_scale", "input_scale"), Int8Channel())
    if algo == "MXFP4":
        return PackedFp4Scheme("modelopt", ("weight", "weight_scale", "input_scale"), Mxfp4(), "weight", "weight_scale_2")
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":
        return Fp8RowScheme("modelopt", ("weight", "weight_scale", "input_scale"), Int8Channel())
    if algo in ("NVFP4", "W4A16_NVFP4"):
        parts = ("weight", "weight_scale", "weight_scale_2", "input_scale")
        return PackedFp4Scheme("modelopt", parts, Mxfp4(), "weight", "weight_scale_2", global_divides=False)
    raise QuantConfigError(f"modelopt quant_algo {qc.get('quant_algo')!r} is not supported "
                           "(FP8, FP8_PB_WO, FP8_PER_CHANNEL_PER_TOKEN, W8A16, MXFP4, NVFP4)")


def _weights_unquantised(method: str) -> None:
    log.info("%s quantization_config without weight quantisation: weights loaded as stored; its KV cache or "
             "activation scales are not used (--kv-cache-dtype chooses the KV cache)", method)


def _int_field(qc: dict[str, Any], key: str, default: Any = None, where: str = "quantization_config",
              alias: str = "") -> int:
    """`qc[key]` (or `qc[alias]`, else `default`) as an integer: a JSON integer, or a string
    or float holding one ("4", 4.0); QuantConfigError naming the field otherwise (null, "four",
    4.5, true), never a value silently truncated."""
    value = qc.get(key, qc.get(alias, default) if alias else default)
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or not float(number).is_integer():
        raise QuantConfigError(f"{where} {key}={value!r}: expected an integer")
    return int(number)


def _square_block(block: Any, where: str) -> int:
    """A [B, B] block (B >= 1) from `weight_block_size` / `block_structure`."""
    b = [_int_field({"block": v}, "block", where=where) for v in block] if isinstance(block, list | tuple) else []
    if len(b) != 2 or b[0] != b[1] or b[0] < 1:
        raise QuantConfigError(f"{where} {block!r}: only square blocks [B, B] with B >= 1 are supported")
    return b[0]


def _group(qc: dict[str, Any], where: str, alias: str = "", default: Any = 128) -> int:
    """`group_size`: >= 1, or -1 (one group a row: 2^30)."""
    group = _int_field(qc, "group_size", default, where, alias)
    if group == 0 or group < -1:
        raise QuantConfigError(f"{where} group_size={group}: expected -1 (one group a row) or a size >= 1")
    return group if group > 0 else 1 << 30


def _fp8(qc: dict[str, Any]) -> Scheme:
    # null or absent: e4m3 (decode checks the dtype); MiniMax-M2 spells it as torch's dtype name
    if str(qc.get("fmt") or "e4m3").lower() not in ("e4m3", "float8_e4m3fn"):
        raise QuantConfigError(f"quantization_config fmt={qc.get('fmt')!r}: only e4m3 fp8 is supported")
    block = _square_block(qc.get("weight_block_size") or [128, 128], "quantization_config weight_block_size")
    if qc.get("weight_block_size") is None:  # per-tensor: AutoFP8 / vLLM call the scale weight_scale (+ input_scale)
        return Fp8Scheme("fp8", ("weight", "weight_scale_inv", "weight_scale", "input_scale"), Fp8Block(block))
    return Fp8Scheme("fp8", ("weight", "weight_scale_inv"), Fp8Block(block))


def _awq_or_gptq(method: str, qc: dict[str, Any], name: str | None = None) -> Scheme:
    """AWQ (4 bits) or GPTQ (4 or 8) from their configs; `name`: the method as said (auto-round)."""
    bits = _int_field(qc, "bits", 4, alias="w_bit")
    group = _group(qc, "quantization_config", "q_group_size")  # -1: one group per row
    said = name or method
    if bits not in (4, 8) or (bits == 8 and method == "awq"):
        raise QuantConfigError(f"{said} with {bits} bits: only 4-bit{' and 8-bit GPTQ' if method == 'gptq' else ''} "
                               "is supported")
    fmt = Int4Group(group) if bits == 4 else Int8Channel()  # 8-bit: experts quantised again at load
    if method == "awq":
        if str(qc.get("version", "gemm")).lower() != "gemm" or not qc.get("zero_point", True):
            raise QuantConfigError(f"AWQ version {qc.get('version')!r} / zero_point {qc.get('zero_point')}: "
                                   "only the GEMM layout with zero points is supported")
        return AwqScheme(said, ("qweight", "qzeros", "scales"), fmt)
    layout = str(qc.get("checkpoint_format", "gptq")).lower()
    if layout not in ("gptq", "gptq_v2") or qc.get("is_marlin_format"):
        raise QuantConfigError(f"GPTQ checkpoint_format {qc.get('checkpoint_format')!r}"
                               + (" (is_marlin_format)" if qc.get("is_marlin_format") else "")
                               + ": only the gptq and gptq_v2 layouts are supported")
    return GptqScheme(said, ("qweight", "qzeros", "scales", "g_idx"), fmt, 0 if layout == "gptq_v2" else 1, bits, group)


def _auto_round(qc: dict[str, Any]) -> Scheme:
    """Intel's AutoRound: integer weights in the layout its `packing_format` names
    (AutoGPTQ's by default: zero − 1; gptqmodel's and its own: the zero itself; AutoAWQ's)."""
    packing = str(qc.get("packing_format", "auto_round:auto_gptq")).lower()
    if str(qc.get("data_type", "int")).lower() != "int" or ("gptq" not in packing and "awq" not in packing
                                                          and packing != "auto_round"):
        raise QuantConfigError(f"auto-round data_type {qc.get('data_type')!r} packed as {packing!r}: only integer "
                               "weights in the auto_gptq, gptqmodel, auto_round or auto_awq packing are supported")
    if "awq" in packing:
        return _awq_or_gptq("awq", qc | {"version": "gemm", "zero_point": True}, "auto-round")
    v2 = "auto_gptq" not in packing  # auto_round:gptqmodel and auto_round store the zero itself
    return _awq_or_gptq("gptq", qc | {"checkpoint_format": "gptq_v2" if v2 else "gptq"}, "auto-round")


# What a weight scheme's tensors depend on (observers, actorder, dynamic: only how it was computed).
_LAYOUT_KEYS = ("num_bits", "type", "symmetric", "strategy", "group_size", "block_structure")


def _layout_value(weights: dict[str, Any], key: str) -> str:
    """A scheme's `key` as compared between groups (`symmetric` absent: true, its default)."""
    return str(weights.get(key, True if key == "symmetric" else None))


def _weight_group(qc: dict[str, Any]) -> dict[str, Any] | None:
    """The one weight scheme of `config_groups` (None: none quantises weights). Groups that
    differ only in their `targets` (a recipe naming attention and experts apart) are one."""
    groups = {k: g for k, g in (qc.get("config_groups") or {}).items() if g.get("weights")}
    layouts = {k: (g.get("format") or qc.get("format"), *(_layout_value(g["weights"], f) for f in _LAYOUT_KEYS))
               for k, g in groups.items()}
    if len(set(layouts.values())) > 1:
        raise QuantConfigError(f"compressed-tensors config_groups {sorted(groups)} store weights in "
                               f"{len(set(layouts.values()))} different layouts ({', '.join(map(str, layouts.values()))}): "
                               "only one weight layout (in one group or several) is supported")
    return next(iter(groups.values()), None)


def _compressed(qc: dict[str, Any]) -> Scheme | None:
    group = _weight_group(qc)
    if group is None:  # only a KV cache or activation scheme: the weights are as they were
        return _weights_unquantised("compressed-tensors")
    w, fmt_name = group["weights"], group.get("format") or qc.get("format")  # a group's own wins
    where = "quantization_config config_groups weights"
    bits = _int_field(w, "num_bits", 8, where)  # compressed-tensors' default: 8
    kind, strategy = w.get("type"), w.get("strategy")
    if fmt_name == "naive-quantized":  # the weight in the bit width's torch dtype: int8 / e4m3, as these
        fmt_name = "float-quantized" if kind == "float" else "int-quantized"
    if fmt_name == "pack-quantized" and bits == 4 and kind == "int" and strategy in ("group", "channel"):
        parts = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
        group = _group(w, where, default=None) if strategy == "group" else 1 << 30  # channel: one group a row
        return PackedScheme("compressed-tensors", parts, Int4Group(group))
    symmetric_channel8 = bits == 8 and kind == "int" and strategy == "channel" and w.get("symmetric", True)
    if fmt_name == "pack-quantized" and symmetric_channel8:
        return Packed8Scheme("compressed-tensors", ("weight_packed", "weight_scale", "weight_shape"), Int8Channel())
    if fmt_name == "pack-quantized" and bits == 8 and kind == "int" and strategy in ("group", "channel"):
        # by group (W8A16), or asymmetric by channel (one group a row): dequantised, zero points applied
        parts = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
        size = _group(w, where, default=None) if strategy == "group" else 1 << 30
        return Int8GroupScheme("compressed-tensors", parts, Int8Channel(), size)
    if fmt_name == "int-quantized" and symmetric_channel8:
        return IntScheme("compressed-tensors", ("weight", "weight_scale"), Int8Channel())
    fp8 = fmt_name == "float-quantized" and bits == 8 and w.get("symmetric", True)  # a zero point: refused below
    if fp8 and strategy == "block":
        block = _square_block(w.get("block_structure"), f"{where} block_structure")
        return Fp8Scheme("compressed-tensors", ("weight", "weight_scale"), Fp8Block(block), "weight_scale")
    if fp8 and strategy == "tensor":
        return Fp8Scheme("compressed-tensors", ("weight", "weight_scale"), Fp8Block(), "weight_scale")
    if fp8 and strategy == "channel":
        return Fp8RowScheme("compressed-tensors", ("weight", "weight_scale"), Int8Channel())
    if fmt_name in ("mxfp4-pack-quantized", "nvfp4-pack-quantized") and bits == 4 and kind == "float":
        nv = fmt_name.startswith("nv")
        parts = ("weight_packed", "weight_scale") + (("weight_global_scale",) if nv else ())
        return PackedFp4Scheme("compressed-tensors", parts, Mxfp4())
    asym = "" if w.get("symmetric", True) else " asymmetric (symmetric: false)"
    raise QuantConfigError(f"compressed-tensors format {fmt_name!r} with {bits}-bit {kind} {strategy}{asym} weights "
                           "is not supported (pack-quantized int4 group or channel, int8 channel or group, mxfp4 and "
                           "nvfp4 pack-quantized, int-quantized int8 channel symmetric, float-quantized fp8 "
                           "symmetric by block, channel or tensor)")
