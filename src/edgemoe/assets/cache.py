"""The cache directory where built assets live (the Qwen3 tokenizer, the demo model,
random presets' tokenizer directories), and atomic writes into it."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """``$EDGEMOE_CACHE_DIR`` or ``~/.cache/edgemoe``; created on demand."""
    root = os.environ.get("EDGEMOE_CACHE_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "edgemoe"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file there, a parent that is one, no permission
        where = f"EDGEMOE_CACHE_DIR={root!r}" if root else f"the cache directory {path}"
        raise ValueError(f"{where}: cannot make it a directory ({e.strerror or e})") from None
    return path


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temp path next to ``dest``; on success it replaces ``dest`` atomically.

    NOTE: same directory so ``os.replace`` is a rename on one filesystem; readers
    never see a half-written file, and concurrent writers simply race to identical content.
    """
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; cached files are ordinary user files
    try:
        yield Path(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temp directory next to ``dest``; on success it is renamed to ``dest``.

    NOTE: a reader never sees a partial directory; if another process renamed its
    (identical) copy into place first, that copy is kept and ours is dropped.
    """
    import shutil

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary user directory
    try:
        yield tmp
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, obj: Any) -> None:
    """Pretty JSON, UTF-8, non-ASCII kept readable (as the Hub's files are)."""
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
