"""Build and load the CPU kernel library once per machine, into a cache folder.

The sources (`linear.cpp`, `attention.cpp`, `norm.cpp`, `activation.cpp`, `decode.cpp`,
`sample.cpp`) compile into one shared library per instruction set: `avx512vnni` (AVX-512
F/BW/VL/DQ + VNNI: the int8 block dots of `q8dot.h` as `vpdpbusd`), `avx512` (the same without
VNNI) and `avx2` (AVX2/FMA/F16C). `load()`
takes the one `isa()` names (the widest this CPU runs, by torch's own run-time detection:
`torch.backends.cpu.get_cpu_capability()` and its CPU feature table; `$RADIXLM_CPU_ISA` caps it),
builds it on first use with
the system C++ compiler (`$CXX`, else g++ or c++; OpenMP) into
`$RADIXLM_CACHE_DIR` (default `~/.cache/radixlm`)/`cpu_kernels/<hash>/`, and opens it with ctypes:
a plain C ABI, no torch headers, so a build takes seconds. Where nothing can be built or loaded
(no compiler, a CPU without AVX2, `RADIXLM_CPU_KERNELS=0`), `load()` returns None and logs one
line saying why; callers then use torch's kernels.

# NOTE: builds write to a temporary name and `os.replace` it into place, so concurrent processes
# (the engine's children, parallel tests) never load a half-written library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

logger = logging.getLogger(__name__)

_DIR = os.path.dirname(__file__)
_SOURCES = [
    os.path.join(_DIR, f)
    for f in [
        "linear.cpp",
        "attention.cpp",
        "norm.cpp",
        "activation.cpp",
        "rotary.cpp",
        "decode.cpp",
        "sample.cpp",
    ]
]
_HEADERS = [
    os.path.join(_DIR, f)
    for f in [
        "linear_simd.h",
        "kquants.h",
        "q8dot.h",
        "q8pack.h",
        "gemv.h",
        "attention.h",
        "activation.h",
        "rotary.h",
    ]
]
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
_AVX512 = [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]
_FLAGS = {"avx2": _AVX2, "avx512": _AVX512, "avx512vnni": [*_AVX512, "-mavx512vnni"]}
# NOTE: -ffp-contract=off: no FMA the source does not write, so one expression rounds the same in
# every kernel it is inlined into (the batch invariance of gemv.h relies on it).
_BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-fno-math-errno"]
_BASE_FLAGS += ["-ffp-contract=off"]
DISABLE_ENV = "RADIXLM_CPU_KERNELS"  # "0": always use torch's kernels
ISA_ENV = "RADIXLM_CPU_ISA"  # the widest build to use (see `isa`)


def widest_isa() -> str | None:
    """The widest instruction set of `_FLAGS` this CPU runs, or None."""
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    if cap.startswith("AVX512"):
        features = getattr(torch._C._cpu, "_get_cpu_capability", dict)()
        return "avx512vnni" if features.get("avx512_vnni") else "avx512"
    if cap == "AVX2":
        return "avx2"
    return None


def isa() -> str | None:
    """The build `load()` uses: the widest this CPU runs, capped by `$RADIXLM_CPU_ISA` (or None).

    NOTE: every build computes the same numbers (q8dot.h, gemv.h): tests/kernels/
    test_cpu_batch_invariance.py checks the AVX-512 builds bit for bit against AVX2 on a CPU
    that runs them (first run on an AVX-512 VNNI machine on 2026-12-07)."""
    widest = widest_isa()
    if widest is None:
        return None
    order = list(_FLAGS)
    cap = os.environ.get(ISA_ENV, widest)
    if cap not in _FLAGS:
        raise ValueError(f"{ISA_ENV}={cap!r}: one of {', '.join(order)}")
    return order[min(order.index(cap), order.index(widest))]


def compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return shutil.which("g++") or shutil.which("c++")


def cache_dir() -> str:
    root = os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm"
    )
    return os.path.join(root, "cpu_kernels")


def build(target: str, cxx: str) -> str:
    """Compile the library for `target` (a key of `_FLAGS`) unless cached; returns its path."""
    src = b""
    for name in _SOURCES + _HEADERS:
        with open(name, "rb") as f:
            src += f.read()
    flags = _BASE_FLAGS + _FLAGS[target]
    key = hashlib.sha256(src + " ".join([cxx, *flags]).encode()).hexdigest()[:16]
    out_dir = os.path.join(cache_dir(), key)
    path = os.path.join(out_dir, f"librlcpu_{target}.so")
    if os.path.exists(path):
        return path
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        subprocess.run(
            [cxx, *flags, *_SOURCES, "-o", tmp], check=True, capture_output=True, text=True
        )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.rl_linear_dense.argtypes = [p, i64, i64, p, i32, i64, p]
    lib.rl_linear_quant.argtypes = [p, i64, i64, p, i32, i64, p]
    lib.rl_dequant.argtypes = [p, i32, i64, i64, p]
    lib.rl_set_threads.argtypes = [i32]
    lib.rl_decode_attention.argtypes = [p, p, p, i32, p, i64, p, p, i64, i64, i64, i64]
    lib.rl_decode_attention.argtypes += [ctypes.c_float, p]
    lib.rl_decode_attention.restype = i32
    lib.rl_rmsnorm.argtypes = [p, p, p, ctypes.c_float, i64, i64, p, p]
    lib.rl_rmsnorm.restype = i32
    lib.rl_rotary.argtypes = [p, i64, i64, p, i64, i64, i64, i64, p, i64, p, p]
    lib.rl_rotary.restype = i32
    lib.rl_silu_mul.argtypes = [p, i64, i64, p]
    lib.rl_silu_mul.restype = i32
    lib.rl_decode_scratch.argtypes = [p, i64]
    lib.rl_decode_scratch.restype = i64
    lib.rl_decode_step.argtypes = [p, p, p, p, p, p, i64, p, p]
    lib.rl_decode_step.restype = i32
    lib.rl_sample_rows.argtypes = [p, i64, i64, i64, p, p, p, p, p, p, p]
    lib.rl_sample_rows.restype = i32
    for fn in (lib.rl_linear_dense, lib.rl_linear_quant, lib.rl_dequant, lib.rl_simd_width):
        fn.restype = i32
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The kernel library for this CPU, or None (logged once) where torch's kernels must serve."""
    why = None
    target = isa()
    cxx = compiler()
    if os.environ.get(DISABLE_ENV, "1") == "0":
        why = f"{DISABLE_ENV}=0"
    elif target is None:
        why = "this CPU has no AVX2"
    elif cxx is None:
        why = "no C++ compiler found (set $CXX or install g++)"
    if why is None:
        try:
            lib = _bind(ctypes.CDLL(build(target, cxx)))
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            why = f"the build failed ({detail.strip().splitlines()[-1:] or e})"
        else:
            logger.info("CPU kernels: %s library (%d fp32 lanes)", target, lib.rl_simd_width())
            return lib
    logger.warning("CPU kernels unavailable (%s): linear layers use torch's kernels", why)
    return None
