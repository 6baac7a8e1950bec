"""Kernel tests run on CUDA when present, else in Triton's CPU interpreter.

# NOTE: TRITON_INTERPRET must be set before any `@triton.jit` kernel is created, i.e. before the
# kernel modules are imported; pytest imports this conftest before the test modules of this folder.
# It is set process-wide (os.environ), so on a CPU machine it also holds for tests of other folders
# collected in the same pytest process. That is harmless: no other part of radixlm uses Triton on
# CPU (the interpreter is the only way Triton runs there at all).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    """Where kernel inputs live: the GPU if there is one, else the CPU (interpreter)."""
    return DEVICE


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
