"""Where the server's API key comes from: `--api-key`, `--api-key-file` or `$EDGEMOE_API_KEY`.

`--api-key KEY` shows the key to every user of the machine (the process list); a file
(readable by you alone) or the environment variable does not. Precedence: a flag
beats the environment; the two flags together are an error.
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

ENV_VAR = "EDGEMOE_API_KEY"


def resolve_api_key(flag: str | None, path: str | None, environ: Mapping[str, str]) -> str | None:
    """The key to require, or None. ValueError names the flag or file that is wrong."""
    if flag is not None and path is not None:
        raise ValueError("give --api-key or --api-key-file, not both")
    if flag is not None:
        if not flag.strip():  # e.g. `--api-key "$KEY"` with KEY unset: refused, never served without a key
            raise ValueError("--api-key is empty: give the key, or leave the flag out to serve without one")
        log.warning("--api-key is visible to other users in the process list; prefer --api-key-file or $%s", ENV_VAR)
        return flag
    if path is not None:
        return read_key_file(Path(path))
    return environ.get(ENV_VAR) or None


def read_key_file(path: Path) -> str:
    """The key in `path`: its text without surrounding whitespace, one line."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--api-key-file {path}: cannot read it ({exc})") from None
    if not text or "\n" in text:
        raise ValueError(f"--api-key-file {path}: must hold the key alone, on one line")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("--api-key-file %s is readable by other users (chmod 600 it)", path)
    return text
