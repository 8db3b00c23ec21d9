"""Knobs read from the environment (`EDGEMOE_TRITON=0` and the other A/B settings).

`env_switch`: "1", "on", "true", "yes" and "0", "off", "false", "no" (any case), or unset /
empty for the default; anything else is refused naming the variable. The knobs compared the
value with "0" or "1", so `EDGEMOE_TRITON=off` silently meant on: an A/B that measured one arm
twice. `env_whole`: a whole number (µs, ns: the unit named in the refusal).
"""

from __future__ import annotations

import os

ON = frozenset({"1", "on", "true", "yes"})
OFF = frozenset({"0", "off", "false", "no"})


def env_switch(name: str, default: bool) -> bool:
    """The switch `name`: True / False as set, `default` where unset or empty."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ON:
        return True
    if raw in OFF:
        return False
    raise ValueError(f"{name}={os.environ[name]!r}: 1 or 0 (on / off, true / false, yes / no)")


def env_whole(name: str, default: int, unit: str, minimum: int = 0) -> int:
    """The whole number `name` holds (of `unit`, named when it is refused; at least
    `minimum`), `default` where unset or empty."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        least = f" >= {minimum}" if minimum else ""
        raise ValueError(f"{name} must be a whole number of {unit}{least} (got {raw!r})")
    return int(raw)
