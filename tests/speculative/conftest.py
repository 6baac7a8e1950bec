"""Fixtures shared by the draft-model tests (test_draft_*.py)."""

from __future__ import annotations

import pytest
from speculative.draft_heads import TARGET_SEED, save_head, save_llama


@pytest.fixture(scope="session")
def paths(tmp_path_factory) -> dict[str, str]:
    """Checkpoint folders: the target, a smaller random draft with its vocabulary ("small"), the
    two random heads ("EAGLE", "EAGLE3"), and the target again as its own draft ("self")."""
    out = {}
    for name, make in (
        ("target", lambda p: save_llama(p, seed=TARGET_SEED)),
        ("small", lambda p: save_llama(p, seed=5, hidden=32, layers=1, heads=2)),
        ("EAGLE", lambda p: save_head(p, "EAGLE", seed=1)),
        ("EAGLE3", lambda p: save_head(p, "EAGLE3", seed=1)),
    ):
        out[name] = str(tmp_path_factory.mktemp(name.lower()))
        make(out[name])
    out["self"] = out["target"]
    return out
