"""`edgemoe plan`: the format a checkpoint stores its experts in, from its config files alone.

The checkpoint's `quantization_config` (or hf_quant_config.json beside config.json) gives
its scheme, as the loader reads it (`models/quant_load.checkpoint_scheme`). Each planned
format is then resolved as the engine resolves `--expert-dtype`
(`quant.resolve_expert_format`): `auto` keeps the checkpoint's format, and naming the
checkpoint's own kind keeps its group / block size, so that row's expert bytes carry the
checkpoint's own scales. Random presets have no scheme: their experts are unquantised.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROW_WIDE = 1 << 30  # the group of GPTQ / AWQ's group_size -1: one group a row


@dataclass(frozen=True)
class Checkpoint:
    method: str | None  # the scheme's quant_method (fp8, gptq, …); None: unquantised
    format: Any  # the ExpertFormat the engine loads its experts in under auto; None: unquantised

    def resolve(self, setting: str, dtype: Any) -> Any:
        """The ExpertFormat the engine loads the experts in for `--expert-dtype setting`."""
        from edgemoe.quant import resolve_expert_format

        return resolve_expert_format(setting, self.format, dtype)

    def is_auto(self, setting: str, dtype: Any) -> bool:
        """Whether `setting` loads the experts as `--expert-dtype auto` (the default) does."""
        return self.resolve(setting, dtype) == self.resolve("auto", dtype)


UNQUANTISED = Checkpoint(None, None)


def checkpoint_of(config: dict[str, Any], where: Path) -> Checkpoint:
    """The checkpoint's scheme from its config files; CheckpointError (a ValueError) naming
    the file when its quantization_config is malformed or unsupported. The safetensors
    headers are not read (the loader's check for experts stored unquantised beside a scheme)."""
    from edgemoe.models.quant_load import checkpoint_scheme

    scheme = checkpoint_scheme(config, where)
    return UNQUANTISED if scheme is None else Checkpoint(scheme.method, scheme.format)


def label(fmt: Any) -> str:
    """A format as the report names it ("int4 (group 32)", "fp8 e4m3 (64x64 blocks)")."""
    if getattr(fmt, "group", 0) >= ROW_WIDE:
        return f"{fmt.name} (one group a row)"
    return fmt.label


def checkpoint_line(ckpt: Checkpoint, dtype: Any, planned: bool) -> str:
    """The report's line on the checkpoint's experts and the format `auto` loads them in;
    `planned`: whether that format has a row (the one marked *)."""
    where = "the row marked *" if planned else "not among --formats"
    if ckpt.format is None:
        return (f"unquantised: --expert-dtype auto (the default; {where}) keeps the experts in the model's dtype "
                f"({str(dtype).removeprefix('torch.')}); the other formats quantise them at load")
    return (f"{ckpt.method} checkpoint: --expert-dtype auto (the default; {where}) loads the experts in "
            f"{label(ckpt.format)}; bf16 dequantises them at load, the other formats re-quantise them")
