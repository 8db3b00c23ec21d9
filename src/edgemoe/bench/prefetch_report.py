"""Decode prefetch's figures in `bench decode`'s row and its printed line: what it copied
and used between two statistics snapshots (recall, precision, bytes copied for nothing),
and `--moe-prefetch auto`'s choice."""

from __future__ import annotations

from typing import Any

AUTO_KEYS = ("prefetch_auto", "prefetch_auto_step_ms", "prefetch_auto_windows", "prefetch_auto_verdicts")


def prefetch_traffic(before: dict[str, Any], after: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """Decode prefetch between two snapshots: experts prefetched and used, precision (used /
    prefetched), recall (used / every expert the step missed had prefetch not existed: the
    used ones plus the misses left to the step, the CPU's included) and the bytes copied
    for nothing; recall among the copied misses alone too (`prefetch_recall_copies`: the
    prefetch leaves the CPU share's picks to it by design). Prefetched experts count among
    `misses` (they were copied)."""
    pf = after["prefetched"] - before.get("prefetched", 0)
    used = after["prefetch_used"] - before.get("prefetch_used", 0)
    left = d["misses"] - pf
    nbytes = d["bytes_copied"] / max(1, d["misses"] - d["experts_cpu"])  # a copied expert's (the CPU's copy nothing)
    return {"prefetch": after["prefetch"], "prefetched": pf, "prefetch_used": used,
            "prefetch_precision": used / pf if pf else None,
            "prefetch_recall": used / (used + left) if used + left else None,
            "prefetch_recall_copies": used / copies if (copies := used + left - d["experts_cpu"]) > 0 else None,
            "gb_prefetched_unused": (pf - used) * nbytes / 1e9,
            **{k: after[k] for k in AUTO_KEYS if k in after}}


def prefetch_note(moe: dict[str, Any]) -> str:
    """Decode prefetch's recall and precision, when it ran; `--moe-prefetch auto`'s choice."""
    auto = moe.get("prefetch_auto")
    figures = ", ".join(f"{k} {v:.2f} ms" for k, v in moe.get("prefetch_auto_step_ms", {}).items())
    chose = f", prefetch auto: {auto} after {moe['prefetch_auto_verdicts']} verdicts ({figures})" if auto else ""
    if not moe.get("prefetched"):
        return chose
    copies = moe.get("prefetch_recall_copies")
    among = f" ({copies:.2f} of the copies)" if copies is not None and moe.get("experts_cpu") else ""
    return (f" prefetch ({moe['prefetch']}) recall {moe['prefetch_recall']:.2f}{among} precision "
            f"{moe['prefetch_precision']:.2f}, {moe['gb_prefetched_unused']:.2f} GB unused{chose}")
