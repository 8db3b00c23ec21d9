"""scripts/prune_jit_cache.py: the carried Triton cache keeps the newest entries of each
kernel name and nothing else goes."""

from __future__ import annotations

import os


def entry(root, name: str, kernel: str, mtime: float) -> str:  # noqa: ANN001
    path = os.path.join(root, name)
    os.makedirs(path)
    for suffix in (".cubin", ".json"):
        open(os.path.join(path, kernel + suffix), "w").close()
    os.utime(path, (mtime, mtime))
    return path


def test_only_the_newest_entries_of_each_kernel_stay(script_module, tmp_path) -> None:  # noqa: ANN001
    prune = script_module("prune_jit_cache").prune
    plans = [entry(tmp_path, f"p{i}", "_plan_wave", 1000 + i) for i in range(5)]
    gather = entry(tmp_path, "g", "_gather_parts_into", 10)
    other = tmp_path / "not-a-dir"
    other.write_text("")
    assert prune(str(tmp_path), keep=2) == 3
    assert sorted(os.listdir(tmp_path)) == ["g", "not-a-dir", "p3", "p4"]
    assert os.path.isdir(gather) and not os.path.exists(plans[0])
