"""Other tools' spellings of the same checkpoint load the same model.

- transformers 5 holds a layer's experts stacked (`experts.gate_up_proj` [E, 2I, H], gate
  rows first, `experts.down_proj` [E, H, I]); a checkpoint saved without its conversion
  back (or by a tool patching it, as gptqmodel does) ships them so, for every family.
- transformers 5's `save_pretrained(save_original_format=False)` writes each of Qwen3.8's
  n-gram (PLE) tables whole, `ple.ple_embedding.ngram_embedding.weight`: its `shard_K`
  row chunks concatenated (the reverse of transformers' `Concatenate(dim=0)` conversion).
- gptqmodel writes Mixtral's GPTQ / AWQ checkpoints under transformers 5's module names
  (`mlp.gate`, `mlp.experts.E.gate_proj` / `up_proj` / `down_proj`), llm-compressor its
  compressed-tensors ones as `block_sparse_moe.experts.E.gate_proj` / ..., not the classic
  `block_sparse_moe.experts.E.w1` / `w3` / `w2` (seen with gptqmodel 7.7 and
  llm-compressor 0.14: `scripts/gptqmodel_check.py`, `scripts/llmcompressor_check.py`).

Each respelled checkpoint holds the same values, so it must give the same logits, bitwise.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgemoe import LLM
from edgemoe.models.names import Placement, Stacked, spelled_as_stored

PROMPT = list(range(2000, 2023))
MIXTRAL_AS_LLMCOMPRESSOR = ((".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj."))
MIXTRAL_AS_GPTQMODEL = ((".block_sparse_moe.", ".mlp."), *MIXTRAL_AS_LLMCOMPRESSOR)
EXPERTS = {"qwen3_moe": "mlp.experts", "olmoe": "mlp.experts", "mixtral": "block_sparse_moe.experts"}
HALVES = {"qwen3_moe": ("gate_proj", "up_proj", "down_proj"), "olmoe": ("gate_proj", "up_proj", "down_proj"),
          "mixtral": ("w1", "w3", "w2")}


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out |= load_file(str(f))
    return out


def _write(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".json" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def _stacked(tensors: dict[str, torch.Tensor], model_type: str, prefix: str | None = None) -> dict[str, torch.Tensor]:
    """Each layer's per-expert matrices as transformers 5 stacks them (under `prefix`)."""
    gate, up, down = HALVES[model_type]
    pat = re.compile(rf"model\.layers\.(\d+)\.{re.escape(EXPERTS[model_type])}\.(\d+)\.(\w+)\.weight")
    out, per = {}, {}
    for name, t in tensors.items():
        if m := pat.fullmatch(name):
            per.setdefault(int(m[1]), {})[(int(m[2]), m[3])] = t
        else:  # gptqmodel's Mixtral: the router under `mlp` too
            out[name.replace(".block_sparse_moe.", ".mlp.") if prefix else name] = t
    for layer, mats in per.items():
        n = 1 + max(e for e, _ in mats)
        lp = f"model.layers.{layer}.{prefix or EXPERTS[model_type]}."
        out[lp + "gate_up_proj"] = torch.stack([torch.cat([mats[e, gate], mats[e, up]]) for e in range(n)])
        out[lp + "down_proj"] = torch.stack([mats[e, down] for e in range(n)])
    return out


def _logits(path: Path, **kw: object) -> torch.Tensor:
    with LLM(str(path), dtype="float32", **kw) as llm:
        return llm.prompt_logits(PROMPT)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "olmoe", "mixtral"])
def test_experts_stacked_as_transformers_holds_them(model_type: str, make_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    src = make_ckpt(model_type, torch_dtype="float32")
    want = _logits(src)
    prefixes = [None] + (["mlp.experts"] if model_type == "mixtral" else [])  # and in gptqmodel's module names
    for k, prefix in enumerate(prefixes):
        stacked = _write(src, tmp_path / f"s{k}", _stacked(_tensors(src), model_type, prefix))
        for store in ("pageable", "mmap"):
            assert torch.equal(_logits(stacked, expert_store=store), want), (prefix, store)


def test_qwen4_ple_tables_whole_as_transformers_holds_them(make_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    """Once refused as missing every `ngram_embedding.shard_K.weight`; a disk PLE store's second
    load (tables already in its files) skips the whole table as it skips the shards."""
    src = make_ckpt("qwen4_exp_text", torch_dtype="float32")
    shard = re.compile(r"(.*\.ngram_embedding)\.shard_(\d+)\.weight")
    tensors, chunks = {}, {}
    for name, t in _tensors(src).items():
        if m := shard.fullmatch(name):
            chunks.setdefault(m[1], {})[int(m[2])] = t
        else:
            tensors[name] = t
    assert chunks  # the tiny model has PLE layers
    whole = _write(src, tmp_path / "whole", tensors | {
        table + ".weight": torch.cat([parts[k] for k in sorted(parts)]) for table, parts in chunks.items()})
    want = _logits(src)
    assert torch.equal(_logits(whole), want)
    for _ in range(2):  # the first load writes the table files, the second reads them
        assert torch.equal(_logits(whole, ple_store="disk", ple_dir=str(tmp_path / "ple")), want)


@pytest.mark.parametrize("spelling", [MIXTRAL_AS_GPTQMODEL, MIXTRAL_AS_LLMCOMPRESSOR], ids=["gptqmodel", "llmcompressor"])
def test_mixtral_in_other_tools_names(spelling, make_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    src = make_ckpt("mixtral", torch_dtype="float32")

    def respell(name: str) -> str:
        for ours, theirs in spelling:
            name = name.replace(ours, theirs)
        return name

    theirs = _write(src, tmp_path / "m", {respell(k): v for k, v in _tensors(src).items()})
    assert any(".experts.0.gate_proj." in k for k in _tensors(theirs))
    assert torch.equal(_logits(theirs), _logits(src))


def test_mixtral_gptq_in_gptqmodel_names(tmp_path: Path) -> None:
    """A 4-bit Mixtral as gptqmodel writes it: quantised parts under the other names
    (llm-compressor's compressed-tensors Mixtral: `block_sparse_moe.experts.E.gate_proj`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))
    from quant_ckpt_support import write_int4

    from edgemoe.assets.checkpoint import model_config

    ours, _ = write_int4(model_config("mixtral", num_hidden_layers=2), tmp_path / "q", tmp_path / "dense", "gptq")
    tensors = _tensors(ours)
    for old, new in MIXTRAL_AS_GPTQMODEL:
        tensors = {k.replace(old, new): v for k, v in tensors.items()}
    theirs = _write(ours, tmp_path / "theirs", tensors)
    assert json.loads((theirs / "config.json").read_text())["quantization_config"]["quant_method"] == "gptq"
    want = _logits(ours, moe_backend="cpu")
    assert torch.equal(_logits(theirs, moe_backend="cpu"), want)


def test_the_spelling_with_more_stored_names_wins() -> None:
    names = {"a.x.weight": Placement("p"), "a.y.weight": Placement("q")}
    stacked = {"a.s": Stacked(Placement("r"), ("a.x.weight",))}
    spelling = ((r"^a\.", "b."),)
    # ours when it matches as many (a tie keeps ours) ...
    assert spelled_as_stored(names, stacked, ["a.x.weight", "b.y.weight"], [spelling]) == (names, stacked)
    # ... the other when it matches more; quantised parts count by their module
    got, got_stacked = spelled_as_stored(names, stacked, ["b.x.qweight", "b.x.scales", "b.y.weight"], [spelling])
    assert set(got) == {"b.x.weight", "b.y.weight"}
    assert got_stacked == {"b.s": Stacked(Placement("r"), ("b.x.weight",))}
