"""`edgemoe convert --model DIR --expert-dtype X --out DIR`: quantise a checkpoint's experts
once and write the result in a standard layout (`quant/publish.py`), so `--model OUT`
loads it later without the work and other tools can read it.

The checkpoint is read through the loader (streamed tensor by tensor, experts quantised
as they arrive, like `--expert-dtype` at serve time), then written layer by layer into
safetensors shards with an index; the config gains the `quantization_config`, every
other file of the model directory (tokenizer, chat template, generation config) is
copied. Non-expert layers keep the checkpoint's dtype (a quantised source's are
dequantised); peak memory is the converted model. Tensors the loader skips (a vision
tower, an MTP head) are copied as stored from an unquantised source, so the output is
still the whole model for other tools; every linear left unquantised is in the config's
ignore list (a tied LM head too: transformers builds it as a Linear).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from edgemoe.models.checkpoint_files import safetensors_files
from edgemoe.models.loader import LoadedModel, load_checkpoint, read_arch
from edgemoe.models.names import NameMap, Placement, Spelling, spelled_as_stored
from edgemoe.models.quant_load import declares_quantization
from edgemoe.models.registry import model_module, skipped_prefixes
from edgemoe.quant import Int4Group, Mxfp4
from edgemoe.quant.publish import (
    encode_fused_mxfp4,
    encode_linear,
    quantization_config,
    shard_bytes,
    shared_group,
)

log = logging.getLogger(__name__)

SHARD_BYTES = 4 * 2**30
WEIGHT_FILES = ("model.safetensors.index.json", "config.json")


class ShardWriter:
    """Tensors → model-0000k-of-0000n.safetensors (~SHARD_BYTES each) + the index."""

    def __init__(self, out: Path, shard_bytes: int = SHARD_BYTES) -> None:
        self.out, self.limit = out, shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.written: list[tuple[str, list[str]]] = []  # (temporary file name, tensor names)
        self.total = 0

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        self.pending |= {n: t.contiguous() for n, t in tensors.items()}
        if shard_bytes(self.pending) >= self.limit:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        tmp = f"shard-{len(self.written):05d}.tmp"
        save_file(self.pending, str(self.out / tmp), metadata={"format": "pt"})
        self.total += shard_bytes(self.pending)
        self.written.append((tmp, list(self.pending)))
        self.pending = {}

    def finish(self) -> None:
        self.flush()
        n, weight_map = len(self.written), {}
        for k, (tmp, names) in enumerate(self.written, start=1):
            fname = f"model-{k:05d}-of-{n:05d}.safetensors"
            (self.out / tmp).rename(self.out / fname)
            weight_map |= {name: fname for name in names}
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def convert(model_dir: str | Path, expert_dtype: str, out_dir: str | Path, progress: bool = True) -> Path:
    """Write `model_dir` with its experts in `expert_dtype` to `out_dir` (must not exist or be empty)."""
    src, out = Path(model_dir), Path(out_dir)
    if not src.is_dir():
        raise FileNotFoundError(f"model (--model) {str(model_dir)!r}: no such directory")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # a file: the CLI's error, not a traceback
        raise FileExistsError(f"out (--out) {out}: exists and is not an empty directory")
    arch = read_arch(src)[0]
    module = model_module(arch.model_type)
    names = _output_names(module, arch, expert_dtype)  # before the (long) load: a refusal costs nothing
    made = not out.exists()
    try:  # made now, so a folder that cannot be is refused before the load, not after it
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"out (--out) {out}: cannot make it ({e.strerror or e})") from None
    try:
        label = _write(src, out, module, names, expert_dtype, progress)
    except BaseException:  # a failed or interrupted convert leaves no half-written model behind
        _clear(out, made)
        raise
    log.warning("converted %s → %s (experts %s)", src, out, label)
    return out


def _clear(out: Path, made: bool) -> None:
    """Remove what a failed convert wrote: `out` itself where it made it, else its contents
    (it was empty)."""
    if made:
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _write(src: Path, out: Path, module: ModuleType, names: NameMap, expert_dtype: str, progress: bool) -> str:
    """Load `src` with its experts in `expert_dtype` and write it to `out`; the format's label."""
    loaded = load_checkpoint(src, "auto", progress, "ram", expert_dtype=expert_dtype)
    fmt = loaded.experts.format
    writer = ShardWriter(out)
    unquantised = _write_dense(loaded, names, writer)
    if loaded.arch.tie_word_embeddings:
        unquantised.append("lm_head")  # tied: not stored, but transformers builds it as a Linear
    unquantised += _copy_skipped(src, module, loaded, writer)
    group = shared_group(fmt, loaded.experts.down_shape) if isinstance(fmt, Int4Group) else 0
    asymmetric = _write_experts(loaded, names, writer, progress, group)
    writer.finish()
    config = dict(loaded.config)
    config.pop("quantization_config", None)
    if isinstance(config.get("text_config"), dict):  # a multimodal source may say it there (quant_load)
        config["text_config"] = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
    if (qc := quantization_config(fmt, unquantised, asymmetric, group)) is not None:
        config["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in WEIGHT_FILES:
            shutil.copy2(f, out / f.name)
    return fmt.label


def _output_names(module: ModuleType, arch: Any, expert_dtype: str) -> NameMap:
    """The checkpoint names to write. gpt-oss's per-layer mxfp4 tensors are read back into
    `<p>.experts.{e}.gate_proj/up_proj/down_proj`: a model whose experts are named otherwise
    (Mixtral's w1/w3/w2) is written in the module's other spelling that has those names and
    that the loader recognises from the written names (Mixtral: transformers 5's `mlp.`)."""
    names = module.checkpoint_map(arch)
    if expert_dtype == "mxfp4" and getattr(arch, "shared_in_store", False):
        # NOTE: the loader reads a gpt-oss layer tensor as every expert of the bank, the
        # shared one included, which gpt-oss's routed tensors do not hold: refused, not written unloadable.
        raise ValueError(f"--expert-dtype mxfp4: {arch.model_type}'s shared expert is held with its routed experts "
                         "(shared_expert_intermediate_size == moe_intermediate_size), which gpt-oss's layout has no "
                         "place for; use fp8, int8 or int4")
    if expert_dtype != "mxfp4" or _has_gpt_oss_names(names):
        return names
    for spelling in getattr(module, "SPELLINGS", ()):
        respelled = {_respell(n, spelling): p for n, p in names.items()}
        written = _fused_names(respelled)
        if _has_gpt_oss_names(respelled) and spelled_as_stored(names, {}, written, module.SPELLINGS)[0] == respelled:
            return respelled
    raise ValueError(f"--expert-dtype mxfp4: {arch.model_type}'s experts have no gate_proj/up_proj/down_proj "
                     "names, which gpt-oss's per-layer layout is read back into")


def _respell(name: str, spelling: Spelling) -> str:
    for pattern, repl in spelling:
        name = re.sub(pattern, repl, name)
    return name


def _has_gpt_oss_names(names: NameMap) -> bool:
    return any(".experts.0.gate_proj." in n for n in names)


def _fused_names(names: NameMap) -> list[str]:
    """The tensor names an mxfp4 output holds: the non-expert ones and each layer's fused parts."""
    out = [n for n, p in names.items() if not p.target.startswith("experts.")]
    for n in names:
        if ".experts.0.gate_proj." in n:
            prefix = n.split(".experts.")[0]
            out += [f"{prefix}.experts.{proj}_{part}" for proj in ("gate_up_proj", "down_proj")
                    for part in ("blocks", "scales")]
    return out


def _copy_skipped(src: Path, module: ModuleType, loaded: LoadedModel, writer: ShardWriter) -> list[str]:
    """The tensors the loader skips by prefix (a vision tower, an MTP head), copied as stored:
    the output is still the whole model for other tools. Returns their linears' names (left
    unquantised). A quantised source's are left out (their layout is the source's scheme)."""
    prefixes = skipped_prefixes(module, loaded.arch)
    if not prefixes:
        return []
    linears, dropped, quantised = [], 0, declares_quantization(loaded.config)
    for fname in safetensors_files(src):
        with safe_open(str(src / fname), framework="pt") as f:
            for name in f.keys():
                if not name.startswith(prefixes):
                    continue
                if quantised:
                    dropped += 1
                    continue
                t = f.get_tensor(name)
                writer.add({name: t})
                if t.dim() == 2 and name.endswith(".weight") and "embed" not in name:
                    linears.append(name.removesuffix(".weight"))
    if dropped:
        log.warning("%s: %d tensor(s) edgemoe does not read (e.g. a vision tower) are not written: "
                    "a quantised source's are in its own scheme", src, dropped)
    return linears


def _to_stored(loaded: LoadedModel, name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` in the model family's stored layout where it has its own (the model file's
    `to_stored`: gpt-oss's interleaved gate/up), so the loader's `stored_layout` reads it back."""
    to_stored = getattr(model_module(loaded.arch.model_type), "to_stored", None)
    return t if to_stored is None else to_stored(name, t)


def _slice(t: torch.Tensor, place: Placement) -> torch.Tensor:
    return t[place.index] if place.index else t


def _write_dense(loaded: LoadedModel, names: NameMap, writer: ShardWriter) -> list[str]:
    """Every non-expert tensor under its checkpoint name; returns the linears' module names."""
    linears = []
    for name, place in names.items():
        if place.target.startswith("experts."):
            continue
        t = _slice(loaded.params[place.target], place)
        writer.add({name: _to_stored(loaded, name, t.clone())})
        if t.dim() == 2 and "embed" not in place.target:
            linears.append(name.removesuffix(".weight"))
    return linears


def _write_experts(loaded: LoadedModel, names: NameMap, writer: ShardWriter, progress: bool, group: int) -> bool:
    """Expert matrices in the store's format (int4 in published groups of `group`); True
    if any int4 zero point is not 8."""
    store, fmt = loaded.experts, loaded.experts.format
    by_layer: dict[int, list[tuple[str, Placement]]] = {}
    for name, place in names.items():
        if place.target.startswith("experts."):
            by_layer.setdefault(int(place.target.split(".")[1]), []).append((name, place))
    asymmetric = False
    for layer in tqdm(sorted(by_layer), desc="writing experts", unit="layer", disable=not progress, leave=False):
        banks = store.layer_parts(layer)
        if isinstance(fmt, Mxfp4):
            writer.add({n: _to_stored(loaded, n, t) for n, t in _fused(by_layer[layer], banks).items()})
            continue
        for name, place in by_layer[layer]:
            parts, shape = _matrix(banks, place, store.down_shape)
            if fmt.quantised:
                asymmetric |= bool("_zero" in parts and (parts["_zero"] != 8).any())
                writer.add(encode_linear(fmt, name, parts, shape, group))
            else:
                writer.add({name: parts[""].clone()})
    return asymmetric


def _matrix(banks: dict[str, torch.Tensor], place: Placement, down_shape: tuple[int, int]) -> tuple[dict[str, torch.Tensor], tuple[int, int]]:
    """One expert matrix's parts (by suffix) from the layer's banks, and its dense shape."""
    _, _, which = place.target.split(".")
    e = int(place.index[0])  # type: ignore[arg-type]
    hidden, inter = down_shape
    parts = {n[len(which):]: t[e] for n, t in banks.items() if n.startswith(which)}
    if which == "down":
        return {s: t.clone() for s, t in parts.items()}, (hidden, inter)
    rows = place.index[1]
    half = 0 if isinstance(rows, slice) and (rows.start or 0) == 0 else 1
    out = {}
    for s, t in parts.items():
        n = t.shape[0] // 2
        out[s] = t[half * n : (half + 1) * n].clone()
    return out, (inter, hidden)


def _fused(entries: list[tuple[str, Placement]], banks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    first = next((name for name, _ in entries if ".experts.0.gate_proj." in name), None)
    if first is None:  # _output_names picked names that have them
        raise ValueError("mxfp4 output needs experts named <p>.experts.{e}.gate_proj/up_proj/down_proj (gpt-oss layout)")
    prefix = first.split(".experts.")[0]
    gate_up = {n[len("gate_up"):]: t for n, t in banks.items() if n.startswith("gate_up")}
    down = {n[len("down"):]: t for n, t in banks.items() if n.startswith("down")}
    return encode_fused_mxfp4(prefix, gate_up, down)


def run_convert(args: Any) -> int:
    try:
        convert(args.model, args.expert_dtype, args.out, progress=True)
    except OSError as e:  # a full disk, a file that can't be read or written: a message, not a traceback
        if isinstance(e, (FileNotFoundError, FileExistsError)):
            raise
        where = f" ({e.filename})" if e.filename else ""
        raise ValueError(f"{e.strerror or e}{where}; nothing of it is left in --out {args.out}") from None
    return 0
