"""Kernel tests run on CUDA when present, else in Triton's CPU interpreter (TRITON_INTERPRET is
set by tests/conftest.py, before any test module imports a kernel)."""

from __future__ import annotations

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    """Where kernel inputs live: the GPU if there is one, else the CPU (interpreter)."""
    return DEVICE


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
