"""Keeps the Triton cache carried to the GPU machine under the carry limit: at most KEEP
entries a kernel name, the newest by modification time (scripts/gpu_env.sh's
save_jit_cache calls it). Every edit of a kernel's source or of a constant it closes over
adds a cache entry under a new hash, so a name used for weeks piles up hundreds (405 of
`_share_begin` on 2026-12-07); a live entry evicted only costs its recompilation.

    python3 scripts/prune_jit_cache.py .triton-cache [KEEP]
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import defaultdict

KEEP = 60


def kernel_name(entry: str) -> str:
    cubins = [f[: -len(".cubin")] for f in os.listdir(entry) if f.endswith(".cubin")]
    return cubins[0] if cubins else os.path.basename(entry)


def prune(root: str, keep: int = KEEP) -> int:
    """Removes all but the `keep` newest entries of each kernel name; returns how many went."""
    by_name: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for name in os.listdir(root):
        entry = os.path.join(root, name)
        if os.path.isdir(entry):
            by_name[kernel_name(entry)].append((os.stat(entry).st_mtime, entry))
    removed = 0
    for entries in by_name.values():
        for _, entry in sorted(entries, reverse=True)[keep:]:
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


if __name__ == "__main__":
    root = sys.argv[1]
    print(f"JIT cache: {prune(root, int(sys.argv[2]) if len(sys.argv) > 2 else KEEP)} old entries removed from {root}")
