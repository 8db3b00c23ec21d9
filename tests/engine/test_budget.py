"""The memory planner's arithmetic at the real Qwen3-30B-A3B shape."""

from __future__ import annotations

import pytest

from edgemoe.engine.budget import (
    GiB,
    PlanError,
    expert_nbytes,
    kv_bytes_per_token,
    parse_size,
    plan_memory,
)
from edgemoe.models import qwen3_moe

QWEN3_30B = dict(
    model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
    num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
    max_position_embeddings=40960, norm_topk_prob=True, torch_dtype="bfloat16",
)


@pytest.fixture()
def arch():  # noqa: ANN201
    return qwen3_moe.arch(QWEN3_30B)


def plan(arch, **kw):  # noqa: ANN001, ANN003, ANN201
    base = dict(backend="auto", moe_slots=None, kv_tokens=None, max_model_len=40960,
                max_prefill_tokens=2048, max_running=8, budget=16 * GiB, context=600 * 2**20)
    return plan_memory(arch, **(base | kw))


def test_sizes_match_the_published_arithmetic(arch) -> None:  # noqa: ANN001
    assert expert_nbytes(arch) == 3 * 2048 * 768 * 2  # 9.44 MB
    assert kv_bytes_per_token(arch) == 2 * 48 * 4 * 128 * 2


def test_16gib_plan_offloads_and_fits(arch) -> None:  # noqa: ANN001
    p = plan(arch)
    assert p.backend == "auto"  # the slot cache; the live controller picks offload or hybrid
    assert p.total <= 16 * GiB
    assert 0.10 < p.num_slots / (48 * 128) < 0.30  # PERF-NOTES: ~21% of experts at 16 GiB
    assert "expert slots" in p.table() and "budget (--gpu-memory)" in p.table()


def test_big_budget_goes_resident(arch) -> None:  # noqa: ANN001
    p = plan(arch, budget=120 * GiB)
    assert p.backend == "resident" and p.num_slots == 0 and p.total <= 120 * GiB


def test_impossible_plans_say_what_to_lower(arch) -> None:  # noqa: ANN001
    with pytest.raises(PlanError, match="raise --gpu-memory"):
        plan(arch, budget=2 * GiB)
    with pytest.raises(PlanError, match="--kv-tokens"):
        plan(arch, kv_tokens=130_000)
    with pytest.raises(PlanError, match=r"^0 expert slots \(0\.00 GiB\) \+ KV"):  # not a negative count
        plan(arch, kv_tokens=10**11)
    with pytest.raises(PlanError, match="--moe-backend offload"):
        plan(arch, backend="resident")
    with pytest.raises(PlanError, match="--moe-slots"):
        plan(arch, moe_slots=5000)


def test_cpu_plan_has_no_budget(arch) -> None:  # noqa: ANN001
    p = plan(arch, budget=None, backend="offload")
    assert p.budget is None and p.num_slots == 48 * 128 // 4


@pytest.mark.parametrize("text,n", [("16GiB", 16 * GiB), ("16G", 16 * GiB), ("900MiB", 900 * 2**20), ("1.5GiB", int(1.5 * GiB)), ("1024", 1024)])
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_parse_size_error_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--gpu-memory"):
        parse_size("lots")


def test_formats_and_fp8_kv_fill_the_freed_memory_with_slots(arch) -> None:  # noqa: ANN001
    from edgemoe.quant import expert_format

    kv = dict(kv_tokens=8192)  # the scenario: --gpu-memory 16GiB --kv-tokens 8192
    bf16 = plan(arch, **kv)
    fp8 = plan(arch, **kv, expert_format=expert_format("fp8"))
    int4 = plan(arch, **kv, expert_format=expert_format("int4"))
    for p, fmt in ((fp8, "fp8"), (int4, "int4")):
        assert p.slot_bytes == expert_nbytes(arch, expert_format(fmt)) and p.total <= 16 * GiB
        assert p.expert_format.startswith(fmt)
        # The same room for slots (each plan's floor leaves less than one of its slots unused).
        assert abs(p.num_slots * p.slot_bytes - bf16.num_slots * bf16.slot_bytes) < p.slot_bytes + bf16.slot_bytes
    assert 1.9 < fp8.num_slots / bf16.num_slots <= 2.0  # fp8: half the bytes, plus block scales
    assert 0.38 < fp8.num_slots / (48 * 128) < 0.42  # the issue: "about 40% of experts fit instead of 20%"
    assert int4.num_slots > 3.5 * bf16.num_slots
    kv8 = plan(arch, **kv, expert_format=expert_format("fp8"), kv_cache_dtype="fp8")
    assert kv8.kv_bytes == 8192 * 2 * 48 * 4 * (128 + 4) and kv8.num_slots > fp8.num_slots
    assert abs((kv8.num_slots - fp8.num_slots) * kv8.slot_bytes - (fp8.kv_bytes - kv8.kv_bytes)) <= kv8.slot_bytes
    assert "fp8" in kv8.table()


def test_flash_next_plan_counts_its_tables_and_gives_a_host_embedding_to_slots(tmp_path) -> None:  # noqa: ANN001
    """At the random:qwen3.8-flash-next shape under 16 GiB: the device PLE tables and the QSA
    selection workspace are rows of the plan; an embedding kept in host memory leaves the
    dense weights and its bytes become expert slots; the host plan counts what is pinned."""
    import torch

    from edgemoe.engine.big_tables import TablePlan
    from edgemoe.models.presets import parse_random
    from edgemoe.models.registry import model_module
    from edgemoe.ple.factory import plan_ple

    config = parse_random("random:qwen3.8-flash-next").config
    a = model_module(config["model_type"]).arch(config)
    embed_bytes = 248320 * 2048 * 2  # 0.95 GiB
    kw = dict(backend="offload", max_model_len=32768, kv_tokens=32768, max_running=4)

    def tables(kind: str, embed: bool) -> TablePlan:
        return TablePlan(plan_ple(kind, a.ple, torch.device("cuda"), a.dtype, tmp_path, "x", tmp_path), embed, 2052)

    on_device = tables("device", False)
    p_dev = plan(a, budget=32 * GiB, extras=on_device.device_rows(), **kw)
    assert ("PLE tables", a.ple.table_nbytes(2)) in p_dev.extras and "QSA selection workspace" in p_dev.table()
    host, host_embed = tables("host", False), tables("host", True)
    p = plan(a, extras=host.device_rows(), **kw)
    q = plan(a, extras=host_embed.device_rows(), host_params=host_embed.host_params, **kw)
    assert p.total <= 16 * GiB and q.total <= 16 * GiB
    assert p.weights - q.weights == embed_bytes
    assert abs((q.num_slots - p.num_slots) - embed_bytes / expert_nbytes(a)) < 1  # 0.95 GiB / 6 MiB: ~162 slots
    rows = {r.name: r.nbytes for r in host_embed.host_rows(a, on_cuda=True)}
    assert rows == {"PLE tables": a.ple.table_nbytes(2), "token embedding": embed_bytes}
    disk = tables("disk", False)
    assert disk.device_rows()[0][0] == "PLE step rows (disk store)" and "PLE staging" in {
        r.name for r in disk.host_rows(a, on_cuda=True)}


def test_slot_pool_warning_only_below_one_tokens_working_set() -> None:
    """Qwen3-30B-A3B at 8 GiB in bf16 (276 slots, 48 MoE layers x 8) warns, with what the
    scan-resistant LRU keeps (276 - 8); the 16 GiB pool (1,187) and no pool (resident) do
    not; a shared expert counts as a pair."""
    from edgemoe.engine.budget import slot_pool_warning

    text = slot_pool_warning(276, 48, 8)
    assert text is not None and "276 slots" in text and "48 x 8 = 384" in text and "--expert-dtype" in text
    assert "keeps about 268 of them resident (70%)" in text and "other ~116" in text
    assert slot_pool_warning(1187, 48, 8) is None
    assert slot_pool_warning(384, 48, 8) is None  # exactly one token's set: LRU keeps it
    assert slot_pool_warning(0, 48, 8) is None
    assert slot_pool_warning(359, 40, 9) is not None  # 8 routed + 1 shared over 40 layers


def test_graph_pool_holds_the_decode_split_k_partials(arch, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    # moe_decode with gate/up split S ways allocates fp32 partials [T*K, S, 2, I] inside the
    # graph capture: the pool must grow by at least that at the largest captured batch.
    from edgemoe.engine.budget import graph_pool_bytes, workspace_bytes

    base, base_ws = graph_pool_bytes(arch, 64), workspace_bytes(arch, 2048, 8)
    monkeypatch.setenv("EDGEMOE_MOE_GEMV_TILES", "16,128,4,16,128,4,4")
    partials = 64 * 8 * 4 * 2 * 768 * 4  # 64 tokens x K=8 pairs x S=4 x (gate, up) x I x fp32
    assert graph_pool_bytes(arch, 64) - base >= partials
    assert workspace_bytes(arch, 2048, 8) - base_ws >= partials // 8  # eager: the 8 running decode rows


def test_graph_pool_holds_the_decode_attention_splits(arch, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    # Decode attention allocates its split outputs and LSEs [B, Hq, splits, D + 1] fp32 inside
    # the capture; the splits come from attn_decode_tiles (EDGEMOE_ATTN_DECODE_TILES in a sweep).
    from edgemoe.engine.budget import graph_pool_bytes, workspace_bytes

    monkeypatch.setenv("EDGEMOE_ATTN_DECODE_TILES", "64,64,4,2")
    base, base_ws = graph_pool_bytes(arch, 64), workspace_bytes(arch, 2048, 8)
    monkeypatch.setenv("EDGEMOE_ATTN_DECODE_TILES", "256,64,4,2")
    more = 64 * 32 * (256 - 64) * 129 * 4  # 64 rows x Hq=32 x 192 more splits x (D + LSE) x fp32
    assert graph_pool_bytes(arch, 64) - base == more
    assert workspace_bytes(arch, 2048, 8) - base_ws >= more // 8  # eager: the 8 running decode rows


@pytest.mark.parametrize("chunk", [8192, 16384])
def test_long_chunks_borrow_their_workspace_from_the_slots(arch, chunk: int) -> None:  # noqa: ANN001
    """Issue 13: with streamed chunks lending the slots' tail, the plan reserves a short
    step's workspace; the tail covers the rest of the long chunk's, and the pool keeps the
    stream's double buffer below it."""
    fixed = plan(arch, max_prefill_tokens=chunk, kv_tokens=8192)
    lent = plan(arch, max_prefill_tokens=chunk, kv_tokens=8192, lend_tokens=1024)
    short = plan(arch, max_prefill_tokens=1023, kv_tokens=8192)
    assert fixed.lend_slots == 0 and lent.lend_slots > 0 and lent.lend_tokens == 1024
    assert lent.workspace == short.workspace < fixed.workspace
    assert lent.num_slots == short.num_slots > fixed.num_slots  # a long chunk costs decode no slots
    assert lent.lend_slots * lent.slot_bytes >= fixed.workspace - lent.workspace  # the loan covers the chunk
    assert lent.num_slots - lent.lend_slots >= 2 * 128  # the double buffer stays below the tail
    assert lent.total <= 16 * GiB and "borrows the last" in lent.table()


def test_no_loan_where_chunks_dont_stream_or_the_pool_is_too_small(arch) -> None:  # noqa: ANN001
    assert plan(arch, max_prefill_tokens=1000, lend_tokens=1024).lend_slots == 0  # no chunk streams
    assert plan(arch, budget=120 * GiB, lend_tokens=1024).lend_slots == 0  # resident
    small = dict(budget=8 * GiB, kv_tokens=2048, max_prefill_tokens=8192)
    tight = plan(arch, **small, lend_tokens=1024)  # ~280 slots: a 2-GiB loan would leave < 2·E
    assert tight.lend_slots == 0 and tight == plan(arch, **small)
