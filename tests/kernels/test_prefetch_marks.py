"""Decode prefetch's bookkeeping (`kernels/prefetch_marks.py`): the torch reference against
plain Python sets, and the Triton kernels (under the interpreter on CPU tensors) against
the reference, on decode-sized lists with -1 padding and duplicates, pools that are not a
power of two, and Qwen3.8-Flash-Next's 512 experts. The compiled path runs in the GPU
prefetch tests (tests/gpu/test_prefetch_gpu.py)."""

from __future__ import annotations

import os

import pytest
import torch

from edgemoe.kernels.prefetch_marks import prefetch_marks_ref, prefetch_pins_ref

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs triton (interpreter, CPU-only machine)")


def case(seed: int, T: int, K: int, E: int, S: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    routed = torch.randint(0, E, (T, K), generator=g, dtype=torch.int32)
    routed[torch.rand(T, K, generator=g) < 0.2] = -1
    slot_ids = torch.where(routed >= 0, torch.randint(0, S, (T, K), generator=g, dtype=torch.int32), -1)
    M = min(T * K, E, S)
    n = int(torch.randint(0, M + 1, (1,), generator=g))
    misses = torch.full((2, M), -1, dtype=torch.int32)
    misses[0, :n] = torch.randperm(E, generator=g)[:n].int()
    misses[1, :n] = torch.randperm(S, generator=g)[:n].int()
    loaded = torch.rand(E, generator=g) < 0.3
    return dict(routed=routed, slot_ids=slot_ids, misses=misses, loaded=loaded)


def as_set(t: torch.Tensor) -> set[int]:
    return {int(v) for v in t.reshape(-1) if v >= 0}


@pytest.mark.parametrize("seed", range(6))
def test_the_reference_is_the_sets(seed: int) -> None:
    c = case(seed, T=3, K=4, E=16, S=21)
    pins, used = torch.ones(21, dtype=torch.bool), torch.tensor(5)
    prefetch_pins_ref(c["slot_ids"], pins, c["routed"], c["loaded"], used)
    assert as_set(torch.nonzero(pins)) == as_set(c["slot_ids"])
    assert int(used) == 5 + len(as_set(c["routed"]) & as_set(torch.nonzero(c["loaded"])))
    out, in_flight, loaded, count = torch.zeros(2, 30, dtype=torch.int32), torch.ones(21, dtype=torch.bool), \
        c["loaded"].clone(), torch.tensor(2)
    M = c["misses"].shape[1]
    prefetch_marks_ref(c["misses"], out[:, :M], in_flight, loaded, count)
    assert torch.equal(out[:, :M], c["misses"]) and (out[:, M:] == 0).all()
    assert as_set(torch.nonzero(in_flight)) == as_set(c["misses"][1])
    assert as_set(torch.nonzero(loaded)) == as_set(c["misses"][0])
    assert int(count) == 2 + len(as_set(c["misses"][0]))


@needs_interpreter
@pytest.mark.parametrize("shape", [(1, 8, 128, 1172), (4, 8, 128, 300), (32, 10, 512, 1223), (3, 2, 8, 5)])
def test_the_kernels_match_the_reference(shape: tuple[int, int, int, int]) -> None:
    from edgemoe.kernels.triton_ops.prefetch_marks import prefetch_marks_triton, prefetch_pins_triton

    T, K, E, S = shape
    for seed in range(3):
        c = case(seed, T, K, E, S)
        for count in (False, True):
            got, want = [torch.zeros(S, dtype=torch.bool), torch.tensor(7)], [torch.zeros(S, dtype=torch.bool),
                                                                              torch.tensor(7)]
            used = (c["routed"], c["loaded"]) if count else (None, None)
            prefetch_pins_triton(c["slot_ids"], got[0], *used, got[1] if count else None)
            prefetch_pins_ref(c["slot_ids"], want[0], *used, want[1] if count else None)
            assert torch.equal(got[0], want[0]) and int(got[1]) == int(want[1])
        M = c["misses"].shape[1]
        bufs = [[torch.full((2, M + 3), 9, dtype=torch.int32), torch.ones(S, dtype=torch.bool),
                 torch.ones(E, dtype=torch.bool), torch.tensor(1)] for _ in range(2)]
        prefetch_marks_triton(c["misses"], bufs[0][0][:, :M], *bufs[0][1:])
        prefetch_marks_ref(c["misses"], bufs[1][0][:, :M], *bufs[1][1:])
        for a, b in zip(*bufs, strict=True):
            assert torch.equal(a, b)
