"""Writing benchmark results: one JSON file and one PNG plot per run."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def write_result(out_dir: str | Path, name: str, payload: dict[str, Any]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps({"benchmark": name, "time": stamp, "env": environment(), **payload}, indent=2))
    return path


def plot_lines(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float]]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        xs, ys = zip(*points, strict=True) if points else ((), ())
        ax.plot(xs, ys, marker="o", label=label)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def plot_stacked(path: Path, title: str, ylabel: str, bars: dict[str, dict[str, float]]) -> Path:
    """One stacked bar per label (e.g. a setting), one colour per part; `<path>-breakdown.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = sorted({p for v in bars.values() for p in v})
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(bars) + 2), 4))
    bottoms = [0.0] * len(bars)
    for part in parts:
        heights = [v.get(part, 0.0) for v in bars.values()]
        ax.bar(list(bars), heights, bottom=bottoms, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set(title=title, ylabel=ylabel)
    ax.legend(fontsize="small")
    fig.tight_layout()
    png = path.with_name(path.stem + "-breakdown.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def plot_bars(path: Path, title: str, xlabel: str, bars: dict[str, float], marks: dict[str, float]) -> Path:
    """Horizontal bars (label → value), top to bottom in order, with dashed vertical
    lines at reference values (`marks`, e.g. the host's read bandwidth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.3 * len(bars) + 1.5))
    labels = list(bars)[::-1]
    ax.barh(labels, [bars[k] for k in labels], color="tab:blue")
    for i, (label, x) in enumerate(marks.items()):
        ax.axvline(x, linestyle="--", color=f"C{i + 1}", label=f"{label} {x:.1f}")
    ax.set(title=title, xlabel=xlabel)
    ax.grid(alpha=0.3, axis="x")
    if marks:
        ax.legend(loc="lower right")
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
