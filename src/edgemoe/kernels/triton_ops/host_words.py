"""A word in page-locked host memory that a kernel and a CPU thread hand each other work
by (the CPU share's bell, `kernels/cpu_bell.py`): written and awaited from inside a
launch, so the hand-off costs no stream memory operation between two launches.

A stream memory operation (`cuStreamWriteValue32` / `cuStreamWaitValue32`) is a node of
its own on the stream: the launch after it can't be scheduled while the one before it
runs (it breaks programmatic dependent launch), which costs a launch latency on the very
chain the CPU waits on. From inside the kernel:
- `publish`: once every thread of the program has made its stores (a barrier), each
  stores the value with release semantics at system scope, so a CPU thread that reads it
  sees those stores too (the stores of other threads are ordered before it by the
  barrier: release is cumulative). Every thread stores the same value.
- `await_value`: each thread spins on an acquire load at system scope until the word
  holds the value, so its later loads see what the CPU wrote before it.
Under Triton's interpreter (CPU tensors, the tests) both are a plain store and a volatile
load: the interpreter runs a program at a time in order, and the C thread's stores are
ordinary host stores.

NOTE: the word must be device-visible host memory (a mapped view of a pinned tensor).
A program that awaits a value nobody will write spins forever: await only after the
ring that makes the CPU write it has been issued earlier in stream order.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def publish(ptr, value, INTERP: tl.constexpr):
    """Store `value` (int32) at `ptr` after the program's earlier stores (see the module)."""
    tl.debug_barrier()
    if INTERP:
        tl.store(ptr, value)
    else:
        tl.inline_asm_elementwise(
            "st.release.sys.global.b32 [$1], $2;\n\tmov.b32 $0, 0;", "=r,l,r", [ptr, value],
            dtype=tl.int32, is_pure=False, pack=1,
        )


@triton.jit
def _acquire(ptr, INTERP: tl.constexpr):
    if INTERP:
        return tl.load(ptr, volatile=True)
    return tl.inline_asm_elementwise(
        "ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1,
    )


@triton.jit
def await_value(ptr, value, INTERP: tl.constexpr):
    """Spin until the int32 at `ptr` equals `value` (see the module)."""
    seen = _acquire(ptr, INTERP)
    while seen != value:
        seen = _acquire(ptr, INTERP)
