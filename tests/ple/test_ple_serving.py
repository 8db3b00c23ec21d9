"""Serving Qwen3.8-Flash-Next with its PLE tables in each store and the embedding in host
memory, on a machine without a GPU: greedy tokens identical to the device tables (the rows
are the same bits wherever they live), a second start reusing the disk store's files, the
host plan counting what is pinned, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.engine.budget import PlanError

PROMPTS = [[9707, 11, 1879, 0], [151644, 872, 198, 3838, 151645, 198, 151644, 77091, 198],
           [(7 * i * i + 3 * i) % 150000 + 100 for i in range(30)]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def tokens(path: Path, **settings: object) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of PROMPTS, and the scoring path's logits of the longest one (in chunks of 7)."""
    with LLM(str(path), dtype="float32", **settings) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.prompt_logits(PROMPTS[2])


def test_every_store_and_host_embedding_give_the_device_tokens(make_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    path = make_ckpt("qwen4_exp_text", torch_dtype="float32")
    want, logits = tokens(path, ple_store="device", page_size=1, max_prefill_tokens=7)
    assert tokens(path, ple_store="host", embed_weights="host")[0] == want
    ple_dir = tmp_path / "ple"
    got, got_logits = tokens(path, ple_store="disk", ple_dir=str(ple_dir), page_size=1, max_prefill_tokens=7)
    assert got == want and torch.equal(got_logits, logits)  # the same rows: the same bits
    written = {p.name: p.stat().st_mtime_ns for p in ple_dir.iterdir()}
    assert tokens(path, ple_store="disk", ple_dir=str(ple_dir), embed_weights="host")[0] == want
    assert {p.name: p.stat().st_mtime_ns for p in ple_dir.iterdir()} == written  # reused, not rewritten


def test_host_plan_counts_pinned_tables_and_embedding(make_ckpt) -> None:  # noqa: ANN001
    path = make_ckpt("qwen4_exp_text", torch_dtype="float32")
    with pytest.raises(PlanError, match="PLE tables .* token embedding"):
        LLM(str(path), dtype="float32", ple_store="host", embed_weights="host", host_memory="1MiB")


def test_host_embedding_refused_for_tied_embeddings(make_ckpt) -> None:  # noqa: ANN001
    path = make_ckpt("qwen4_exp_text", torch_dtype="float32", tie_word_embeddings=True)
    with pytest.raises(ValueError, match="ties its embedding to the LM head"):
        LLM(str(path), dtype="float32", embed_weights="host")
