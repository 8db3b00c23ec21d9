"""Quantised checkpoints as published: `quantization_config` → a scheme that turns one
linear's checkpoint tensors into one of our formats, losslessly.

- FP8 (`quant_method: fp8`, Qwen3/Qwen3.5 `*-FP8`, DeepSeek-V3): `weight` e4m3 [N, K] and
  `weight_scale_inv` fp32 [ceil(N/B), ceil(K/B)], B = `weight_block_size` → `Fp8Block`.
- AWQ (`awq`, AutoAWQ "gemm" layout): `qweight` int32 [K, N/8], `qzeros` int32 [K/G, N/8],
  `scales` fp16 [K/G, N]; eight 4-bit values per int32 along N in the order
  [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column 8j + AWQ_ORDER[i]) → `Int4Group`.
- GPTQ (`gptq`): `qweight` int32 [K/8, N] (nibble i of row j: input 8j + i), `qzeros` int32
  [K/G, N/8] (sequential nibbles along N; `checkpoint_format` "gptq" stores zero - 1,
  "gptq_v2" the zero itself), `scales` fp16 [K/G, N], `g_idx` int32 [K] → `Int4Group`;
  act-order (a permuted g_idx, here or compressed-tensors') → dequantised, experts
  quantised again at load into contiguous groups.
- compressed-tensors: "pack-quantized" int4 (`weight_packed` int32 [N, K/8], sequential
  nibbles of q + 8; `weight_scale` [N, K/G]; `weight_zero_point` when asymmetric, packed along
  N, or unpacked int8 [N, G] as older versions stored it) → `Int4Group`; "pack-quantized"
  int8 per channel (`weight_packed` int32 [N, K/4], sequential bytes of q + 128) and "int-quantized" int8 (`weight` int8,
  `weight_scale` [N, 1]) → `Int8Channel`; "float-quantized" fp8 with block scales → `Fp8Block`,
  with one scale a tensor → `Fp8Block` (that scale in every block), with channel scales
  (FP8_DYNAMIC) → dequantised, experts quantised at load into int8 per channel;
  "pack-quantized" int8 by group (W8A16) → the same.
- FP8 with `weight_block_size` null (per-tensor) → `Fp8Block(128)`, every block the tensor's scale;
  the scale `weight_scale_inv` (transformers) or `weight_scale` beside `input_scale` (AutoFP8, vLLM).
- FP4 (compressed-tensors "mxfp4-/nvfp4-pack-quantized", NVIDIA ModelOpt MXFP4 / NVFP4):
  E2M1 pairs, E8M0 a 32 → `Mxfp4`; e4m3 a 16 over a tensor scale → dequantised, experts
  quantised again at load. ModelOpt's FP8 / int8 reuse the FP8 and int8 schemes
  (published_config.py says which).

A linear is recognised by its parts: the names a scheme knows, sharing a base name
"X.weight". A floating-point "X.weight" with no other part is a linear the checkpoint
left unquantised (router, LM head, `modules_to_not_convert`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from edgemoe.quant.formats import ExpertFormat, Parts
from edgemoe.quant.fp8 import Fp8Block
from edgemoe.quant.int4 import Int4Group, pack_nibbles, unpack_nibbles
from edgemoe.quant.mxfp4 import e2m1_lut

log = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a packed int32 holds column AWQ_ORDER[i]
FLOATS = (torch.bfloat16, torch.float16, torch.float32)
Decoded = tuple[ExpertFormat, Parts]


class QuantConfigError(ValueError):
    """A `quantization_config` (or a tensor it governs) we cannot load; the message says why."""


def unpack_int32(packed: torch.Tensor, dim: int, order: tuple[int, ...] | None = None, bits: int = 4) -> torch.Tensor:
    """int32 holding 32/bits values (4 or 8 bits) → uint8 values, unpacked along `dim`.
    Field i (bits i·b .. i·b + b-1) of element j lands at position (32/b)·j + order[i]."""
    per = 32 // bits
    order = order or tuple(range(per))
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    nib = ((packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).to(torch.uint8)  # [..., per] in field order
    inverse = [order.index(p) for p in range(per)]
    nib = nib[..., inverse]  # position order
    nib = nib.movedim(-1, dim + 1)  # the values of element j follow it along `dim`
    shape = list(packed.shape)
    shape[dim] *= per
    return nib.reshape(shape)


_SAID: set[str] = set()


def _said_once(what: str) -> bool:
    """Whether `what` was logged before (a load's thousands of tensors warn once)."""
    seen = what in _SAID
    _SAID.add(what)
    return seen


@dataclass(frozen=True)
class Scheme:
    """How one family of checkpoints stores its quantised linears."""

    method: str
    parts: tuple[str, ...]  # suffixes after the module name, e.g. ("weight", "weight_scale_inv")
    format: ExpertFormat

    def split(self, name: str) -> tuple[str, str] | None:
        """"X.<part>" → ("X.weight", part) for a part of this scheme, else None."""
        module, _, part = name.rpartition(".")
        return (f"{module}.weight", part) if module and part in self.parts else None

    def decode(self, parts: dict[str, torch.Tensor]) -> torch.Tensor | Decoded:
        """One linear's tensors (by part) → a plain weight (unquantised in the
        checkpoint) or (format, our parts)."""
        if "weight" in parts and parts["weight"].dtype in FLOATS:
            if len(parts) > 1 and not _said_once("float beside scales"):
                # transformers' FP8 save leaves a matrix its blocks don't divide as it was
                log.warning("%s: %s weights stored with %s (e.g. %s): loaded as stored, the rest ignored",
                            self.method, parts["weight"].dtype, sorted(set(parts) - {"weight"}), tuple(parts["weight"].shape))
            return parts["weight"]
        try:
            return self._decode(parts)
        except KeyError as e:
            raise QuantConfigError(f"{self.method} linear without its {e.args[0]!r} tensor") from None

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded:
        raise NotImplementedError


@dataclass(frozen=True)
class Fp8Scheme(Scheme):
    scale_name: str = "weight_scale_inv"

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded:
        # per-tensor FP8 as AutoFP8 / vLLM save it (DeepSeek-Coder-V2-Lite-Instruct-FP8): `weight_scale`
        scale = next((n for n in (self.scale_name, "weight_scale") if n in parts), self.scale_name)
        w, s = parts["weight"], parts[scale]
        if s.dtype == torch.uint8:  # `scale_fmt: ue8m0` stored as raw exponent bytes: 2^(e - 127)
            s = s.view(torch.float8_e8m0fnu)
        s = s.float()
        if s.dim() == 4 and s.shape[1] == s.shape[3] == 1:  # ModelOpt's block scales: [N/B, 1, K/B, 1]
            s = s[:, 0, :, 0]
        fmt = self.format
        assert isinstance(fmt, Fp8Block)
        want = fmt.matrix_specs(*w.shape)["_scale"][0]
        if s.numel() == 1 and w.dim() == 2:  # one scale for the tensor: every block's, exactly
            s = s.reshape(1, 1).expand(want)
        if w.dtype != torch.float8_e4m3fn or tuple(s.shape) != want:
            raise QuantConfigError(f"fp8 weight {w.dtype} {tuple(w.shape)} with scales {tuple(s.shape)}: "
                                   f"expected float8_e4m3fn and scales {want} ({fmt.block}x{fmt.block} blocks)")
        return fmt, {"": w, "_scale": s.contiguous()}


@dataclass(frozen=True)
class Fp8RowScheme(Scheme):
    """compressed-tensors "float-quantized" fp8 with one scale per output channel
    (llm-compressor's FP8 / FP8_DYNAMIC): no fp8 layout of ours holds row scales, so each
    linear is dequantised (w = q·s, exact in fp32) and the experts are quantised at load
    into `format`, int8 per channel: the same byte a weight and a scale a row, as the
    checkpoint's, which keeps them nearer its values than fp8's 128-blocks (a block's
    scale is its largest row's). A tensor's one scale is every block's: `Fp8Scheme` takes
    those as they are."""

    def _decode(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        w, s = parts["weight"], parts["weight_scale"].float()
        if w.dtype != torch.float8_e4m3fn or w.dim() != 2 or s.numel() not in (1, w.shape[0]):
            raise QuantConfigError(f"fp8 weight {w.dtype} {tuple(w.shape)} with scales {tuple(s.shape)}: "
                                   "expected float8_e4m3fn and one scale per row")
        _say_requantised(self, "fp8 with a scale per channel")
        return w.float() * s.reshape(-1, 1)


@dataclass(frozen=True)
class Int8GroupScheme(Scheme):
    """compressed-tensors "pack-quantized" int8 by group (llm-compressor's W8A16 preset):
    four q + 128 bytes per int32 along K, `weight_scale` [N, K/G], `weight_zero_point`
    (asymmetric) packed four a word along N. Our int8 has a scale a row, so each linear
    is dequantised (exact in fp32) and the experts quantised at load into `format`."""

    group: int = 128

    def _decode(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        n, k = (int(v) for v in parts["weight_shape"].tolist())
        q = unpack_int32(parts["weight_packed"], 1, bits=8)[:, :k].to(torch.int16) - 128
        s, groups = parts["weight_scale"].float(), -(-k // self.group)
        z = (ct_zero_point(parts["weight_zero_point"], n, 8).to(torch.int16) - 128
             if "weight_zero_point" in parts else torch.zeros_like(s, dtype=torch.int16))
        what = f"int8 by groups of {self.group}" if self.group < k else "int8 by channel"  # channel: one group a row
        if tuple(q.shape) != (n, k) or tuple(s.shape) != (n, groups):
            raise QuantConfigError(f"packed {what} [{n}, {k}]: words {tuple(parts['weight_packed'].shape)}, "
                                   f"scales {tuple(s.shape)}; expected [N, K/4] and [N, {groups}]")
        g = parts["weight_g_idx"] if "weight_g_idx" in parts else torch.arange(k) // self.group  # act-order
        return _by_g_idx(self, q, z, s, g, what)


def _say_requantised(scheme: Scheme, what: str) -> None:
    if not _said_once(f"requantised {what}"):
        log.warning("%s checkpoint with %s weights: no layout of ours holds them, so those linears are dequantised "
                    "and the experts among them quantised again at load, into %s unless --expert-dtype names "
                    "another, which adds that rounding to the checkpoint's (int8 or bf16 keep them nearer)",
                    scheme.method, what, scheme.format.label)


@dataclass(frozen=True)
class Mxfp4Scheme(Scheme):
    """gpt-oss: one tensor per part for all experts of a layer, named
    "<layer>.mlp.experts.gate_up_proj_blocks" [E, N, K/32, 16] and "..._scales" [E, N, K/32]
    (gate rows first in our checkpoints; gpt-oss itself interleaves them)."""

    def split(self, name: str) -> tuple[str, str] | None:
        for part in self.parts:
            if name.endswith("_" + part):
                return name[: -len(part) - 1], part
        return None

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded:
        blocks, scales = parts["blocks"], parts["scales"]
        if blocks.dtype != torch.uint8 or blocks.dim() != 4 or tuple(blocks.shape[:3]) != tuple(scales.shape):
            raise QuantConfigError(f"mxfp4 blocks {tuple(blocks.shape)} / scales {tuple(scales.shape)}: "
                                   "expected uint8 [E, N, K/32, 16] and [E, N, K/32]")
        e, n, g, _ = blocks.shape
        return self.format, {"": blocks.reshape(e, n, g * 16), "_scale": scales}


@dataclass(frozen=True)
class PackedFp4Scheme(Scheme):
    """FP4 weights: `packed` uint8 [N, K/2] (E2M1 codes, element 2j in the low nibble, as
    ours). MXFP4 (compressed-tensors "mxfp4-pack-quantized"): `weight_scale` uint8
    [N, K/32], E8M0 exponents, is our `Mxfp4` as it stands. NVFP4: e4m3 scales a 16
    [N, K/16] and a tensor's `global_scale` (compressed-tensors "nvfp4-pack-quantized":
    `weight_global_scale`, a divisor; NVIDIA ModelOpt: `weight_scale_2`, a factor), which no
    format of ours holds: dequantised, its experts quantised again at load into `format`."""

    packed: str = "weight_packed"
    global_scale: str = "weight_global_scale"
    global_divides: bool = True

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded | torch.Tensor:  # type: ignore[override]
        packed, scale = parts[self.packed], parts["weight_scale"]
        n, k = packed.shape[0], packed.shape[1] * 2
        block = 16 if self.global_scale in parts else 32
        if packed.dtype != torch.uint8 or tuple(scale.shape) != (n, -(-k // block)):
            raise QuantConfigError(f"fp4 weights {packed.dtype} {tuple(packed.shape)} with scales {tuple(scale.shape)}: "
                                   f"expected uint8 [N, K/2] and [N, K/{block}]")
        if block == 32:
            return self.format, {"": packed, "_scale": scale.to(torch.uint8)}
        _say_requantised(self, "nvfp4 (e4m3 scales a 16 over a global scale)")
        codes = unpack_nibbles(packed, k).long()
        g = parts[self.global_scale].float().reshape(())
        per16 = scale.float() / g if self.global_divides else scale.float() * g
        return e2m1_lut()[codes] * per16[:, torch.arange(k) // 16]


@dataclass(frozen=True)
class AwqScheme(Scheme):
    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded:
        q = unpack_int32(parts["qweight"], 1, AWQ_ORDER)  # [K, N]
        z = unpack_int32(parts["qzeros"], 1, AWQ_ORDER)  # [G, N]
        return _int4(self.format, q.T, z.T, parts["scales"].T)


@dataclass(frozen=True)
class GptqScheme(Scheme):
    """GPTQ's layout (AutoGPTQ, gptqmodel, AutoRound's auto_gptq / gptqmodel packing), 4 or
    8 bits a weight: a linear's own width is read off its qweight rows, since per-layer
    recipes (AutoRound's `extra_config`) mix them. 4-bit linears keep their values in
    `Int4Group`; 8-bit ones, and act-order ones, are dequantised (their experts quantised
    again at load into `format`)."""

    zero_offset: int = 1  # checkpoint_format "gptq" stores zero - 1
    bits: int = 4  # the config's, for a linear whose width its shapes don't tell
    group: int = 128  # the config's group_size (-1: 2^30, one group a row)

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded | torch.Tensor:  # type: ignore[override]
        bits = self._bits(parts)
        q = unpack_int32(parts["qweight"], 0, bits=bits)  # [K, N]
        zeros = gptq_v1_zeros(parts["qzeros"], bits) if self.zero_offset else parts["qzeros"]
        z = unpack_int32(zeros, 1, bits=bits).to(torch.int16)  # [G, N]
        g_idx = parts.get("g_idx")
        act_order = _act_order(g_idx, self.group)
        if bits != 4 or self.format != Int4Group(self.group) or act_order:
            g_idx = g_idx if g_idx is not None else torch.arange(q.shape[0]) // self.group
            # a g_idx other than k // group: act-order's permutation, or a per-module group size
            what = f"{bits}-bit with a g_idx other than k // {self.group} (act-order or its own group size)" \
                if act_order else f"{bits}-bit"
            return _by_g_idx(self, q.T, z.T, parts["scales"].T, g_idx, what)
        return _int4(self.format, q.T, z.T.clamp(0, 255), parts["scales"].T)

    def _bits(self, parts: dict[str, torch.Tensor]) -> int:
        """qweight is [K·bits/32, N]: K is g_idx's length, or within the last of its groups;
        where that leaves both widths (one group a row without g_idx, or K within one group),
        qzeros [G, ceil(N·bits/32)] beside scales [G, N] tells."""
        rows, group = parts["qweight"].shape[0], self.group
        if "g_idx" in parts:
            lo = hi = parts["g_idx"].numel()
        elif group < 1 << 30:
            hi = parts["scales"].shape[0] * group
            lo = hi - group + 1
        else:  # one group a row, no g_idx: the rows tell nothing
            lo, hi = 1, rows * 8
        fits = [b for b in (4, 8) if lo <= rows * 32 // b <= hi]
        if not fits:
            raise QuantConfigError(f"GPTQ qweight {tuple(parts['qweight'].shape)} for {lo}..{hi} inputs "
                                   f"(scales {tuple(parts['scales'].shape)} at the config's group_size {group}): "
                                   "neither 4 nor 8 bits a weight (a per-module group size without g_idx?)")
        n, words = parts["scales"].shape[-1], parts["qzeros"].shape[-1]
        fits = [b for b in fits if words == -(-n * b // 32)] or fits
        return self.bits if self.bits in fits else fits[0]


@dataclass(frozen=True)
class PackedScheme(Scheme):
    """compressed-tensors "pack-quantized" (int4)."""

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded | torch.Tensor:  # type: ignore[override]
        n, k = (int(v) for v in parts["weight_shape"].tolist())
        q = unpack_int32(parts["weight_packed"], 1)[:, :k]  # [N, K], unsigned: q + 8
        scale = parts["weight_scale"]
        if "weight_zero_point" in parts:
            zero = ct_zero_point(parts["weight_zero_point"], n, 4)
        else:
            zero = torch.full(scale.shape, 8, dtype=torch.int16)
        if _act_order(parts.get("weight_g_idx"), self.format.group):  # type: ignore[attr-defined]
            return _by_g_idx(self, q, zero, scale, parts["weight_g_idx"], "act-order 4-bit (a permuted g_idx)")
        return _int4(self.format, q, zero, scale)


@dataclass(frozen=True)
class Packed8Scheme(Scheme):
    """compressed-tensors "pack-quantized" int8 per channel (W8A16 as llm-compressor
    writes it): four q + 128 bytes per int32 along K."""

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded:
        n, k = (int(v) for v in parts["weight_shape"].tolist())
        q = unpack_int32(parts["weight_packed"], 1, bits=8)[:, :k]
        s = parts["weight_scale"]
        if tuple(q.shape) != (n, k) or tuple(s.shape) != (n, 1):
            raise QuantConfigError(f"packed int8 [{n}, {k}] with {tuple(parts['weight_packed'].shape)} words and "
                                   f"scales {tuple(s.shape)}: expected [N, K/4] words and [N, 1] scales")
        return self.format, {"": (q.to(torch.int16) - 128).to(torch.int8), "_scale": s.float()}


@dataclass(frozen=True)
class IntScheme(Scheme):
    """compressed-tensors "int-quantized" (int8, per channel; scales [N, 1]); ModelOpt's
    W8A16 (scales [N])."""

    def _decode(self, parts: dict[str, torch.Tensor]) -> Decoded:
        w, s = parts["weight"], parts["weight_scale"]
        s = s.reshape(-1, 1) if s.dim() == 1 else s
        if w.dtype != torch.int8 or tuple(s.shape) != (w.shape[0], 1):
            raise QuantConfigError(f"int8 weight {w.dtype} with scales {tuple(s.shape)}: expected [N, 1] per channel")
        return self.format, {"": w, "_scale": s.float()}


def ct_zero_point(zp: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """compressed-tensors' `weight_zero_point` of a linear with n rows → the unsigned zero
    [N, G] (zero + 2^(bits-1), as its unsigned q). Since compressed-tensors PR #296 (2025-04)
    it is packed like the weights, along N (int32 [ceil(N·bits/32), G]); before, it was the
    module's own signed [N, G] (int8), unpacked, and before PR #59 (2024-05) symmetric
    checkpoints kept theirs too (all 0): unpacking those as words reads garbage of the right
    shape, a silently wrong model."""
    offset = 1 << (bits - 1)
    if zp.dtype != torch.int32 or (zp.shape[0] == n and n != -(-n * bits // 32)):
        return zp.to(torch.int16) + offset  # as stored: signed, one a row
    return unpack_int32(zp, 0, bits=bits)[:n]


def gptq_v1_zeros(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ v1 zero points (`checkpoint_format` "gptq": zero − 1 in each field) as the
    zeros themselves, packed the same way (int64 words). gptqmodel writes v1 by subtracting
    0x11111111 (4 bits; 0x01010101 for 8) from each packed word, so a zero of 0 (asymmetric
    groups, ~13% of words by its own count) borrows from the next field; it reads v1 back by
    adding that word (gptqmodel `utils/model.py`: convert_gptq_v2_to_v1_format_module,
    convert_gptq_v1_to_v2_format_module; transformers loads GPTQ through it). Field by
    field, +1 read such a zero as 2^bits and its neighbour's as one less: a silently wrong
    model. Without a borrow (no field 2^bits − 1: a zero of 2^bits does not exist) both agree."""
    ones = sum(1 << (bits * i) for i in range(32 // bits))
    return (qzeros.long() + ones) & 0xFFFFFFFF


def _act_order(g_idx: torch.Tensor | None, group: int) -> bool:
    """Whether g_idx [K] (input k's group) is other than k // group: act-order (`desc_act`)
    checkpoints permute it, so a group's inputs are not contiguous."""
    if g_idx is None:
        return False
    trivial = torch.arange(g_idx.numel(), dtype=torch.int32) // group
    return not torch.equal(g_idx.to(torch.int32), trivial)


def _by_g_idx(scheme: Scheme, q: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor, g_idx: torch.Tensor,
              what: str) -> torch.Tensor:
    """A linear no format of ours holds (act-order: our groups are contiguous in K; 8 bits
    by group) dequantised, W[n, k] = s[n, g[k]] · (q[n, k] − z[n, g[k]]) in fp32 (exact),
    from q [N, K], zero and scale [N, G]; its experts are quantised again at load, said once."""
    n, k = q.shape
    g = g_idx.long()
    if g.shape != (k,) or int(g.min()) < 0 or int(g.max()) >= scale.shape[1] or zero.shape != scale.shape:
        raise QuantConfigError(f"{what} [{n}, {k}]: g_idx {tuple(g.shape)} (groups {int(g.min())}.."
                               f"{int(g.max())}) against scales {tuple(scale.shape)} / zeros {tuple(zero.shape)}")
    _say_requantised(scheme, what)
    return scale.float()[:, g] * (q.float() - zero.float()[:, g])


def _int4(fmt: ExpertFormat, q: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor) -> Decoded:
    """Our int4 parts from q [N, K], zero [N, G], scale [N, G]."""
    n, k = q.shape
    specs = fmt.matrix_specs(n, k)
    if tuple(scale.shape) != specs["_scale"][0] or tuple(zero.shape) != specs["_zero"][0]:
        raise QuantConfigError(f"int4 [{n}, {k}]: scales {tuple(scale.shape)} / zeros {tuple(zero.shape)}, "
                               f"expected {specs['_scale'][0]} ({fmt.label})")
    scale16 = scale.to(torch.float16)
    if not torch.equal(scale16.to(scale.dtype), scale) and not _said_once(f"int4 scales {scale.dtype}"):
        log.warning("int4 scales in %s rounded to fp16 (ours)", scale.dtype)  # once: a load has thousands
    return fmt, {"": pack_nibbles(q.contiguous()), "_scale": scale16.contiguous(), "_zero": zero.to(torch.uint8).contiguous()}
