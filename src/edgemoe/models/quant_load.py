"""Loading into quantised experts: a published checkpoint's parts, or bf16 quantised as it streams.

`PartCollector` gathers the tensors of one quantised linear (weight + scales, or
qweight/qzeros/scales/g_idx) until all of them have been read — the checkpoint's full
list of names says which exist — then the scheme decodes them into our format.
`place` writes one decoded linear where the model's name map puts it:
- an expert matrix into a `PartsStore`: as is when the formats agree (lossless), else
  dequantised to fp32 and quantised into the store's format (load-time quantisation);
- an expert matrix into an unquantised bank, or any other tensor (attention, dense MLP,
  router): dequantised and cast to the model's dtype (counted in `Upcasts`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from edgemoe.models.checkpoint_files import CheckpointError, all_float, all_names, read_json, safetensors_files
from edgemoe.models.names import NameMap, Placement, names_as_stored
from edgemoe.models.registry import model_module
from edgemoe.moe.parts_store import PartsStore
from edgemoe.moe.store import ExpertStore
from edgemoe.quant import ExpertFormat, Parts
from edgemoe.quant.fused_experts import FusedExperts
from edgemoe.quant.published import Decoded, Fp8Scheme, QuantConfigError, Scheme
from edgemoe.quant.published_config import scheme_for

log = logging.getLogger(__name__)

Value = torch.Tensor | Decoded  # a plain weight, or (format, parts)


def text_quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    """A multimodal config's `text_config.quantization_config` where the top level has none
    (the language model's; the top level's wins when both do), else None."""
    text = config.get("text_config")
    if "quantization_config" not in config and isinstance(text, dict) and "quantization_config" in text:
        return text["quantization_config"]
    return None


def declares_quantization(config: dict[str, Any]) -> bool:
    """Whether config.json says the checkpoint is quantised, at its top or in `text_config`."""
    return "quantization_config" in config or text_quantization(config) is not None


def checkpoint_scheme(config: dict[str, Any], where: Path | str = "config.json") -> Scheme | None:
    """The checkpoint's quantisation scheme (None: unquantised); CheckpointError if unsupported.
    Older NVIDIA ModelOpt exports leave config.json alone and say it in hf_quant_config.json;
    a multimodal config may hold it in `text_config` (the language model's: the top level's wins)."""
    beside = Path(where).with_name("hf_quant_config.json")
    if (text := text_quantization(config)) is not None:
        where = f"{where} (text_config)"
        config = config | {"quantization_config": text}
    try:
        if "quantization_config" not in config and beside.is_file():
            where = beside
            config = config | {"quantization_config": {"quant_method": "modelopt",
                                                       **(read_json(beside).get("quantization") or {})}}
        return scheme_for(config)
    except QuantConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:  # a field of the wrong type
        raise CheckpointError(f"{where}: quantization_config is malformed ({type(e).__name__}: {e})") from None


def stored_expert_format(model_dir: Path, arch: Any, scheme: Scheme | None, names: NameMap | None = None,
                         files: dict[str, list[str]] | None = None) -> ExpertFormat | None:
    """The format the checkpoint stores its experts in (None: unquantised): the scheme's,
    unless every expert matrix is stored unquantised beside it (transformers' FP8 save
    leaves a matrix its blocks don't divide as it was: a tiny model's, all of them).
    `names` / `files`: the name map and file list, when the caller has them already."""
    if scheme is None:
        return None
    files = files if files is not None else safetensors_files(model_dir)
    if names is None:
        names, _ = names_as_stored(model_module(arch.model_type), arch, all_names(model_dir, files))
    experts = {n for n, p in names.items() if p.target.startswith("experts.")}
    return None if all_float(model_dir, files, experts) else scheme.format


class PartCollector:
    """Holds the parts of linears until each is complete (memory: a few linears at once)."""

    def __init__(self, scheme: Scheme, all_names: Iterable[str], inter: int = 0, experts: int = 0) -> None:
        self.scheme = scheme
        self.expected: dict[str, set[str]] = {}
        names = list(all_names)
        # A layer's experts in one tensor (fp8: transformers' fused scales, stacked weights):
        # `inter` / `experts`, the experts' intermediate size and count, split them.
        block = getattr(scheme.format, "block", 0)
        self.fused = FusedExperts(names, scheme.scale_name, inter, block, experts) if isinstance(scheme, Fp8Scheme) else None
        for name in names:
            if (split := scheme.split(name)) is not None:
                self.expected.setdefault(split[0], set()).add(split[1])
            elif self.fused is not None and name in self.fused.fused:
                for base in self.fused.bases(name):
                    self.expected.setdefault(base, set()).add(self.fused.part(name))
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def base(self, name: str) -> str | None:
        """The linear ("X.weight") `name` is a part of (a fused tensor: the first of those it
        covers), or None."""
        if self.fused is not None and name in self.fused.fused:
            return self.fused.bases(name)[0]
        split = self.scheme.split(name)
        return split[0] if split is not None else None

    def add(self, name: str, tensor: torch.Tensor, where: Path | str = "") -> list[tuple[str, Value]]:
        """Keep one part (or a fused tensor: a part of each expert matrix); every linear this
        completes, as (base name, decoded value). `where`: the file, for errors."""
        if self.fused is not None and name in self.fused.fused:
            part = self.fused.part(name)
            return [done for base, t in self.fused.split(name, tensor).items()
                    if (done := self._keep(base, part, t, where))]
        base, part = self.scheme.split(name)  # type: ignore[misc]
        return [done] if (done := self._keep(base, part, tensor, where)) else []

    def _keep(self, base: str, part: str, tensor: torch.Tensor, where: Path | str) -> tuple[str, Value] | None:
        got = self.pending.setdefault(base, {})
        got[part] = tensor
        if set(got) != self.expected.get(base, {part}):
            return None
        del self.pending[base]
        try:
            return base, self.scheme.decode(got)
        except QuantConfigError as e:  # name the file and the linear
            raise CheckpointError(f"{where}: {base.removesuffix('.weight')}: {e}") from None


@dataclass
class Upcasts:
    """Quantised checkpoint tensors that were dequantised at load (said in the plan)."""

    formats: dict[str, int] = field(default_factory=dict)  # format label → tensors
    requantised: int = 0  # expert matrices quantised from another format (or from bf16)

    def note(self) -> str:
        parts = [f"{n} {label} tensor(s) dequantised" for label, n in self.formats.items()]
        if self.requantised:
            parts.append(f"{self.requantised} expert matrices quantised at load")
        return "; ".join(parts)


def check_decoded(path: Path | str, name: str, value: Value, shape: tuple[int, ...]) -> None:
    """A decoded linear's parts against those its format gives the destination's [N, K]:
    dequantising reads K off the destination, so a linear decoded to another width would
    be cut (or padded) to fit, silently."""
    if isinstance(value, torch.Tensor) or len(shape) != 2:
        return
    fmt, parts = value
    want = {s: spec[0] for s, spec in fmt.matrix_specs(*shape).items()}
    got = {s: tuple(t.shape) for s, t in parts.items()}
    if got != want:
        raise CheckpointError(f"{path}: {name.removesuffix('.weight')}: decoded as {fmt.label} with parts {got}, "
                              f"expected {want} for its shape {tuple(shape)}")


def dense_value(value: Value, shape: tuple[int, ...], upcasts: Upcasts | None = None) -> torch.Tensor:
    """A plain tensor for a value (dequantised to fp32 when quantised)."""
    if isinstance(value, torch.Tensor):
        return value
    fmt, parts = value
    if upcasts is not None:
        upcasts.formats[fmt.label] = upcasts.formats.get(fmt.label, 0) + 1
    return fmt.dequantise(parts, *shape)


def expert_parts(value: Value, fmt: ExpertFormat, shape: tuple[int, int], upcasts: Upcasts) -> Parts:
    """A matrix in `fmt`'s parts (keyed by suffix): as is, or (re)quantised."""
    if not isinstance(value, torch.Tensor) and value[0] == fmt:
        return value[1]
    upcasts.requantised += 1
    src = value if isinstance(value, torch.Tensor) else value[0].dequantise(value[1], *shape)
    return fmt.quantise(src)


def place_expert_parts(store: PartsStore, place: Placement, parts: Parts) -> None:
    """Write one matrix's parts into the bank rows `place` names: (e, gate rows) or
    (e, up rows) of gate_up — the first or second half of every part — or (e,) of down."""
    _, layer, which = place.target.split(".")
    e = int(place.index[0])  # type: ignore[arg-type]
    half = None
    if which == "gate_up":
        rows = place.index[1]
        half = 0 if isinstance(rows, slice) and (rows.start or 0) == 0 else 1
    for suffix, t in parts.items():
        dest = store.tensor(int(layer), which + suffix)[e]
        if half is not None:
            n = dest.shape[0] // 2
            dest = dest[half * n : (half + 1) * n]
        if tuple(dest.shape) != tuple(t.shape):
            raise ValueError(f"part {which + suffix} has shape {tuple(t.shape)}, expected {tuple(dest.shape)}")
        dest.copy_(t)


def per_expert(place: Placement, stacked: torch.Tensor, inter: int) -> Iterator[tuple[Placement, torch.Tensor]]:
    """A layer's experts stacked ([n, 2I, H] gate rows first, or [n, H, I]) as one placement
    per matrix, as per-expert checkpoints store them: gate and up apart, then down."""
    experts = place.index[0]
    first = (experts.start or 0) if isinstance(experts, slice) else int(experts)  # type: ignore[arg-type]
    for j in range(stacked.shape[0]):
        if place.target.endswith(".down"):
            yield Placement(place.target, (first + j,)), stacked[j]
        else:
            yield Placement(place.target, (first + j, slice(0, inter))), stacked[j, :inter]
            yield Placement(place.target, (first + j, slice(inter, None))), stacked[j, inter:]


def expert_shape(experts: ExpertStore, place: Placement) -> tuple[int, int]:
    """The dense shape of the matrix `place` names: gate/up [I, H], down [H, I]."""
    hidden, inter = experts.down_shape
    return (hidden, inter) if place.target.endswith(".down") else (inter, hidden)


def pin_keys(experts: ExpertStore, target: str) -> list[tuple[str, str]]:
    """(pin-tracker key, bank name) of every bank an expert target ("experts.L.gate_up")
    fills: the one bank, or each part's bank of a quantised store."""
    _, layer, which = target.split(".")
    if not isinstance(experts, PartsStore):
        return [(target, which)]
    return [(target + name[len(which):], name) for name in experts.layer_parts(int(layer)) if name.startswith(which)]
