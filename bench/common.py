"""Small helpers shared by the `radixlm bench ...` commands: deterministic workloads, a memory
bandwidth probe, and table/JSON output."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from typing import Any

_WORDS = [
    "the",
    "river",
    "mountain",
    "quiet",
    "city",
    "bright",
    "morning",
    "garden",
    "ancient",
    "library",
    "window",
    "story",
    "travel",
    "music",
    "engine",
    "silver",
    "forest",
    "market",
    "summer",
    "winter",
    "harbor",
    "island",
    "bridge",
    "lantern",
    "painter",
    "village",
    "scholar",
    "machine",
    "ocean",
    "desert",
    "cloud",
    "thunder",
    "letter",
    "journey",
    "kitchen",
    "candle",
    "meadow",
]


def synthetic_text(rng: random.Random, words: int) -> str:
    """Plain English-looking text of about `words` words (deterministic for a seeded rng)."""
    out = []
    for i in range(words):
        w = rng.choice(_WORDS)
        out.append(w.capitalize() if i % 12 == 0 else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


def memory_read_bandwidth_gbs(size_mb: int = 1024) -> float:
    """Sustained read bandwidth of this machine through torch (all intra-op threads)."""
    import torch

    x = torch.ones(size_mb * (1 << 20) // 4, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols}
    print(f"\n{title}")
    print("  ".join(c.ljust(widths[c]) for c in cols))
    print("  ".join("-" * widths[c] for c in cols))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in cols))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return "" if v is None else str(v)


def write_json(path: str | None, data: Any) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
