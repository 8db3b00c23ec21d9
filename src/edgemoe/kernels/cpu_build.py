"""Compiling and loading the CPU expert kernel (`kernels/cpu/expert.c`).

The C source ships with the package and is compiled at first use by the system
compiler (`$CC`, else `cc`, `gcc`, `clang`), once per instruction-set variant, into
the cache directory (`$EDGEMOE_CACHE_DIR`, else `~/.cache/edgemoe`, under `kernels/`).
A build is keyed by a hash of the sources, the flags and the compiler's version, so
an edited source or a new compiler rebuilds and nothing stale is ever loaded. The
library is loaded with ctypes: raw pointers in, no torch or Python ABI, so one build
serves any torch on the machine.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ABI_VERSION = 9  # NOTE: must equal EM_ABI_VERSION in expert.c
SOURCE_DIR = Path(__file__).parent / "cpu"
CACHE_ENV = "EDGEMOE_CACHE_DIR"

_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]
VARIANT_CFLAGS: dict[str, list[str]] = {
    "amx": [*_AVX512, "-mamx-tile", "-mamx-bf16", "-DEM_ISA_AMX"],
    "amx-emu": [*_AVX512, "-DEM_ISA_AMX", "-DEM_AMX_EMULATE"],
    "avx512": [*_AVX512, "-DEM_ISA_AVX512"],
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DEM_ISA_AVX2"],
    "scalar": [],
}
# No -ffast-math: the fp32 accumulation must stay IEEE (tests bound its error).
COMMON_CFLAGS = ["-O3", "-std=gnu11", "-shared", "-fPIC", "-pthread"]
DEFINES_ENV = "EDGEMOE_CPU_DEFINES"  # A/B of the kernel's tuning macros: "EM_QPAGES=0 EM_PF_LOCALITY=2"
_DEFINE = re.compile(r"EM_[A-Z0-9_]+=-?[0-9]+")


class BuildError(RuntimeError):
    """The compiler rejected a variant (e.g. no AMX support in an old compiler)."""


def find_compiler() -> str | None:
    """`$CC` if set (and only it: the user chose), else cc, gcc or clang on PATH."""
    if cc := os.environ.get("CC"):
        return shutil.which(cc)
    return next((p for name in ("cc", "gcc", "clang") if (p := shutil.which(name))), None)


@functools.cache
def _compiler_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def cache_dir() -> Path:
    """Where built kernels live; a private temp folder if the home cache is unwritable."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "edgemoe") / "kernels"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"edgemoe-kernels-{os.getuid()}"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _sources() -> list[Path]:
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".c", ".h"))


def tuning_defines(defines: str | None = None) -> list[str]:
    """-D flags from `defines` (None: $EDGEMOE_CPU_DEFINES): the kernel's own integer
    tuning macros only."""
    words = (os.environ.get(DEFINES_ENV, "") if defines is None else defines).split()
    if bad := [w for w in words if not _DEFINE.fullmatch(w)]:
        raise ValueError(f"{DEFINES_ENV}: {' '.join(bad)!r} is not NAME=integer with an EM_ name")
    return [f"-D{w}" for w in words]


def _cflags(variant: str, defines: str | None = None) -> list[str]:
    return [*COMMON_CFLAGS, *VARIANT_CFLAGS[variant], *tuning_defines(defines)]


def build_key(cc: str, variant: str, defines: str | None = None) -> str:
    h = hashlib.sha256()
    for path in _sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(" ".join(_cflags(variant, defines)).encode())
    h.update(_compiler_version(cc).encode())
    return h.hexdigest()[:16]


def build(variant: str, cc: str, defines: str | None = None) -> Path:
    """The shared library for `variant` (tuning macros `defines`, None: the environment's),
    compiled now unless a matching build exists."""
    out = cache_dir() / f"edgemoe_experts-{variant}-{build_key(cc, variant, defines)}.so"
    if out.exists():
        return out
    # NOTE: compile to a private name, then rename: concurrent processes never load a
    # half-written file, and the last rename wins with identical content.
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp.so")
    cmd = [cc, *_cflags(variant, defines), f"-I{SOURCE_DIR}", "-o", str(tmp), str(SOURCE_DIR / "expert.c"), "-lm"]
    log.info("compiling the %s CPU expert kernel: %s", variant, " ".join(cmd))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{cc} failed on the {variant} kernel: {res.stderr.strip()[-2000:]}")
    os.replace(tmp, out)
    return out


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.em_abi_version.restype = i32
    lib.em_isa.restype = ctypes.c_char_p
    lib.em_amx_enable.restype = i32
    lib.em_create.restype, lib.em_create.argtypes = p, [i32, i32]
    lib.em_threads.restype, lib.em_threads.argtypes = i32, [p]
    lib.em_destroy.restype, lib.em_destroy.argtypes = None, [p]
    lib.em_experts.restype = i32
    f32 = ctypes.c_float
    lib.em_experts.argtypes = [p, p, i32, i64, p, i64, i32, i32, p, i32, i32, i32, i32, i32, f32, f32, i32]
    lib.em_read.restype, lib.em_read.argtypes = ctypes.c_uint64, [p, p, i64]
    lib.em_pool_stats.restype, lib.em_pool_stats.argtypes = None, [p, ctypes.POINTER(i64)]
    lib.em_quiesce.restype, lib.em_quiesce.argtypes = None, [p]
    lib.em_host_layer.restype, lib.em_host_layer.argtypes = None, [p]
    lib.em_bell_start.restype, lib.em_bell_start.argtypes = p, [i64, i64, i64, i64, i64]
    lib.em_bell_stop.restype, lib.em_bell_stop.argtypes = None, [p]
    lib.em_bell_quiet.restype, lib.em_bell_quiet.argtypes = None, [p, i32]
    lib.em_copier_start.restype, lib.em_copier_start.argtypes = p, [p, p, p, p, p] + [i64] * 13
    lib.em_copier_stats.restype, lib.em_copier_stats.argtypes = None, [p, ctypes.POINTER(i64)]
    lib.em_copier_busy.restype, lib.em_copier_busy.argtypes = i32, [p]
    lib.em_copier_stop.restype, lib.em_copier_stop.argtypes = None, [p]
    if hasattr(lib, "em_test_stall"):  # EM_TEST_STALL=1 builds only (em_stall.h)
        lib.em_test_stall.restype, lib.em_test_stall.argtypes = None, [i32, i32]
        lib.em_test_holding.restype, lib.em_test_holding.argtypes = i32, []
        lib.em_test_release.restype, lib.em_test_release.argtypes = None, []
        lib.em_test_repack.restype, lib.em_test_repack.argtypes = None, [i32]
        lib.em_test_caller_rescues.restype, lib.em_test_caller_rescues.argtypes = None, [i32]
    if hasattr(lib, "em_phase_times"):  # EM_PHASE_TIMES=1 builds only (em_ptimes.h)
        lib.em_phase_times.restype, lib.em_phase_times.argtypes = i32, [ctypes.POINTER(ctypes.c_long), i32]
    return lib


@functools.cache
def load(variant: str) -> ctypes.CDLL:
    """Build (if needed) and load `variant`. Raises BuildError, or RuntimeError when no
    compiler exists or the OS refuses AMX tile state."""
    return _load(variant)


def load_tuned(variant: str, defines: str) -> ctypes.CDLL:
    """`load` of `variant` built with `defines` ($EDGEMOE_CPU_DEFINES' syntax, e.g.
    "EM_PHASE_TIMES=1"), not cached: builds side by side in one process (the A/B and
    phase-time scripts)."""
    return _load(variant, defines)


def _load(variant: str, defines: str | None = None) -> ctypes.CDLL:
    cc = find_compiler()
    if cc is None:
        raise RuntimeError("no C compiler ($CC, cc, gcc or clang)")
    lib = _declare(ctypes.CDLL(str(build(variant, cc, defines))))
    if lib.em_abi_version() != ABI_VERSION or lib.em_isa().decode() != variant:
        raise BuildError(f"{variant} kernel: ABI {lib.em_abi_version()} / ISA {lib.em_isa().decode()} mismatch")
    # NOTE: Linux gives a process AMX tile state only on request (arch_prctl), and it
    # must be granted before any thread executes a tile instruction.
    if (rc := lib.em_amx_enable()) != 0:
        raise RuntimeError(f"the OS refused AMX tile state (arch_prctl returned {rc})")
    return lib
