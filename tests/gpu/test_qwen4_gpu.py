"""Qwen3.8-Flash-Next on the GPU: the host-memory gathers (pinned tables read over mapped
memory by the Triton row gather) against references, eagerly and inside a captured CUDA
graph, past 2^31 elements; greedy tokens identical for every --ple-store and
--embed-weights (decode steps replayed from graphs); bf16 against transformers' fp32
reference; a preset slice under a 16 GiB cap with its tables on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgemoe import LLM, SamplingParams
from edgemoe.kernels.row_gather import gather_rows, gather_rows_ref
from edgemoe.layers.embedding import HostEmbedding
from edgemoe.moe.pinning import CudaRegistrar, InPlacePinner, uva_view

SMALL = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
    num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128, shared_expert_intermediate_size=128,
    indexer_head_dim=64, indexer_budget=64, hc_count=4, hc_lowrank=32, ple_embed_dim=256,
    ngram_vocab_size_base=200_000,
)
LONG = [(7 * i * i + 3 * i) % 150000 + 100 for i in range(700)]  # sparse QSA (64 of 700), GDN chunks
PROMPTS = [[9707, 11, 1879, 0], [151644, 872, 198, 151645, 198, 151644, 77091, 198], LONG]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
DEVICE = torch.device("cuda")


@pytest.fixture(scope="module")
def qwen4_ckpt(make_ckpt):  # noqa: ANN001, ANN201
    return make_ckpt("qwen4_exp_text", **SMALL)


def pinned(t: torch.Tensor) -> tuple[torch.Tensor, InPlacePinner]:
    pinner = InPlacePinner(CudaRegistrar(DEVICE))
    pinner.submit(t)
    assert pinner.finish()
    return uva_view(t, DEVICE), pinner


def in_graph(fn, ids: torch.Tensor, new_ids: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """fn(ids) captured, then replayed after `ids` is overwritten with `new_ids`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(ids)  # warm-up: Triton compiles off the graph
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(ids)
    ids.copy_(new_ids)
    g.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_host_table_gather_matches_reference_eager_and_in_a_graph(dtype: torch.dtype) -> None:
    table = torch.randn(10_000, 96).to(dtype)
    view, pinner = pinned(table)
    try:
        ids = torch.randint(0, 10_000, (33,), device=DEVICE)
        assert torch.equal(gather_rows(view, ids).cpu(), gather_rows_ref(table, ids.cpu()))
        new = torch.randint(0, 10_000, (33,), device=DEVICE)
        got = in_graph(lambda i: gather_rows(view, i), ids.clone(), new)
        assert torch.equal(got.cpu(), table[new.cpu()])
    finally:
        pinner.release()


def test_gather_offsets_past_2_31_elements() -> None:
    rows, width = (1 << 31) // 64 + 4096, 64  # 4 GiB of bf16: the last rows start past element 2^31
    table = torch.empty((rows, width), dtype=torch.bfloat16)
    table[-4096:] = torch.randn(4096, width).to(torch.bfloat16)
    table[:16] = torch.randn(16, width).to(torch.bfloat16)
    view, pinner = pinned(table)
    try:
        ids = torch.tensor([rows - 1, 3, rows - 4096, 15, rows - 2], device=DEVICE)
        assert torch.equal(gather_rows(view, ids).cpu(), table[ids.cpu()])
    finally:
        pinner.release()


def test_host_embedding_equals_device_rows_in_a_graph() -> None:
    table = torch.randn(5000, 256).to(torch.bfloat16)
    emb = HostEmbedding(table.clone(), DEVICE, CudaRegistrar(DEVICE))
    try:
        ids, new = torch.randint(0, 5000, (8,), device=DEVICE), torch.randint(0, 5000, (8,), device=DEVICE)
        assert torch.equal(emb(ids), table.to(DEVICE)[ids])
        assert torch.equal(in_graph(emb, ids.clone(), new), table.to(DEVICE)[new])
    finally:
        emb.close()


def greedy(path: Path, **settings: object) -> list[list[int]]:
    with LLM(str(path), dtype="bfloat16", device="cuda", **settings) as llm:
        assert llm.engine.runner.graphs is not None, "decode steps should replay from CUDA graphs"
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_tokens_identical_for_every_ple_store_and_embedding(qwen4_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    """The rows are the same bits wherever the tables live; graphs replay each store's path."""
    want = greedy(qwen4_ckpt, ple_store="device", embed_weights="device")
    for store in ("host", "disk"):
        for embed in ("device", "host"):
            got = greedy(qwen4_ckpt, ple_store=store, embed_weights=embed, ple_dir=str(tmp_path))
            assert got == want, (store, embed)


def test_decode_graphs_give_the_eager_tokens_and_traffic_on_the_device_cache(qwen4_ckpt) -> None:  # noqa: ANN001
    """Decode replayed from graphs routes what eager decode routes (a one-row graph once
    skipped its row's experts at every replay: the prompt-logit test can't see a decode
    bug, it feeds the decode's tokens back as a prompt)."""
    runs = []
    for eager in (False, True):
        with LLM(str(qwen4_ckpt), dtype="bfloat16", device="cuda", moe_backend="offload", moe_slots=8,
                 expert_cache="device", no_cuda_graph=eager) as llm:
            assert (llm.engine.runner.graphs is None) == eager
            tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
            runs.append((tokens, {k: llm.stats()["moe"][k] for k in ("hits", "misses")}))
    (graphed, traffic), (eager_tokens, eager_traffic) = runs
    assert graphed == eager_tokens and traffic == eager_traffic, (traffic, eager_traffic)
    assert traffic["misses"] > 0


def test_bf16_gpu_agrees_with_fp32_reference(qwen4_ckpt, monkeypatch) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    from hf_reference import torch_gdn_reference
    from tolerances import bf16_logit_error

    with LLM(str(qwen4_ckpt), dtype="bfloat16", device="cuda", max_prefill_tokens=4096) as llm:
        out = llm.generate([LONG], GREEDY)[0].token_ids
        got = llm.prompt_logits(LONG + out).cpu().float()
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen4_ckpt, dtype=torch.float32).eval()
    torch_gdn_reference(model, monkeypatch)  # the CPU reference off fla's Triton kernels
    with torch.no_grad():
        ref = model(torch.tensor([LONG + out])).logits[0]
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
    # GDN, PLE and the hyper-connection mixes round to bf16 about three times as often as
    # an attention layer's ops: count each layer three times.
    typical, worst = bf16_logit_error(3 * SMALL["num_hidden_layers"])
    err, scale = (ref - got).abs(), ref.std().item()
    assert err.mean().item() < typical * scale and err.max().item() < worst * scale


def test_preset_slice_under_16gib_with_disk_tables(tmp_path: Path) -> None:
    model = "random:qwen3.8-flash-next?num_hidden_layers=4,ple_layer_ids=[2],ngram_vocab_size_base=1000000"
    with LLM(model, device="cuda", gpu_memory="16GiB", ple_store="disk", ple_dir=str(tmp_path),
             embed_weights="host", kv_tokens=40000) as llm:
        out = llm.generate([list(range(1000, 1000 + 9000)), [5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True))
        assert all(len(o.token_ids) == 8 for o in out)
        free, total = torch.cuda.mem_get_info()
        store = llm.engine.runtime.ple
        assert store is not None and store.bytes_read > 0
    assert total - free <= 16 * 2**30, (total - free) / 2**30
