"""Checkpoints written by transformers' own `save_pretrained` (5.24 and 5.25 spelling), and the
same configs respelled the ways other writers spell them (transformers 4.x, the Hub):
transformers reads every spelling as the same config, and so do we — logits checked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tolerances import network_atol

from edgemoe import LLM
from edgemoe.models.hf_config import SCHEMAS
from edgemoe.testing.checkpoint import write_tokenizer_files

transformers = pytest.importorskip("transformers")

SEQ = [5, 900, 17, 1500, 3, 3, 2000, 42] + list(range(100, 140, 3))
# A small vocab keeps four loads per checkpoint cheap (its pad id must then fit in it).
TINY = dict(vocab_size=2048, pad_token_id=None, torch_dtype="float32")
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}  # SEQ runs past 16
CHECKPOINTS = {
    "qwen3_moe": ("qwen3_moe", {}),
    "olmoe": ("olmoe", {}),
    "mixtral": ("mixtral", {}),
    "qwen3_moe-yarn": ("qwen3_moe", {"rope_scaling": YARN}),
}


def respell(config: dict[str, Any], spelling: str) -> dict[str, Any]:
    """`config` as transformers 5 saved it, with one setting spelled another way."""
    c = dict(config)
    if spelling == "attribute_map":  # the alias instead of the name transformers saves
        for alias, name in SCHEMAS[c["model_type"]].attribute_map.items():
            if name in c:
                c[alias] = c.pop(name)
    elif spelling == "torch_dtype":  # transformers 4.x
        c["torch_dtype"] = c.pop("dtype")
    elif spelling == "rope_theta+rope_scaling":  # transformers 4.x: theta on top, scaling apart, "type"
        rope = dict(c.pop("rope_parameters"))
        c["rope_theta"] = rope.pop("rope_theta")
        kind = rope.pop("rope_type")
        c["rope_scaling"] = None if kind == "default" else {"type": kind, **rope}
    return c


SPELLINGS = ["as saved", "attribute_map", "torch_dtype", "rope_theta+rope_scaling"]


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def saved(request, make_ckpt, tmp_path_factory):  # noqa: ANN001, ANN201
    """(name, directory written by save_pretrained, transformers' logits for SEQ)."""
    model_type, overrides = CHECKPOINTS[request.param]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        make_ckpt(model_type, **TINY, **overrides), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    out = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(out)
    write_tokenizer_files(out)
    with torch.no_grad():
        logits = model(torch.tensor([SEQ])).logits[0]
    return request.param, out, logits


def variant(saved_dir: Path, spelling: str, root: Path) -> Path:
    """A checkpoint directory sharing saved_dir's files, with a respelled config.json."""
    out = root / spelling.replace("+", "-").replace(" ", "-")
    out.mkdir()
    for f in saved_dir.iterdir():
        if f.name != "config.json":
            os.symlink(f, out / f.name)
    config = json.loads((saved_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(respell(config, spelling)))
    return out


def hf_view(path: Path) -> dict[str, Any]:
    """The config transformers builds its model from."""
    d = transformers.AutoConfig.from_pretrained(path).to_dict()
    rope = d["rope_parameters"]
    if rope.get("type") == rope["rope_type"]:
        del rope["type"]  # the 4.x key, kept beside the rope_type it became
    return {k: v for k, v in d.items() if not k.startswith("_") and k != "transformers_version"}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_loads_to_transformers_logits(saved, spelling: str, tmp_path: Path) -> None:  # noqa: ANN001
    _, saved_dir, theirs = saved
    path = variant(saved_dir, spelling, tmp_path)
    if spelling != "as saved":
        assert json.loads((path / "config.json").read_text()) != json.loads((saved_dir / "config.json").read_text())
    # transformers reads the respelled config as the saved one, so `theirs` is its answer for it too
    assert hf_view(path) == hf_view(saved_dir)
    with LLM(str(path), dtype="float32", max_prefill_tokens=4096) as llm:
        ours = llm.prompt_logits(SEQ)
    # the longest reduction: the hidden size, 64 (SEQ has 22 tokens, experts are narrower)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=network_atol(torch.float32, 64, theirs.abs().max().item()))


def test_yarn_changes_the_logits(saved, make_ckpt) -> None:  # noqa: ANN001
    """Guard against a YaRN checkpoint that would pass by ignoring its rope_scaling."""
    name, _, theirs = saved
    if "rope_scaling" not in CHECKPOINTS[name][1]:
        pytest.skip("a plain-RoPE checkpoint")
    with LLM(str(make_ckpt("qwen3_moe", **TINY)), dtype="float32") as llm:
        plain = llm.prompt_logits(SEQ)
    assert (plain - theirs).abs().max().item() > 0.1
