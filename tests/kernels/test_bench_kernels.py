"""`radixlm bench kernels` runs its --tiny checks (interpreter on CPU) and writes JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixlm.bench.kernels import main
from radixlm.kernels._triton import HAS_TRITON


def test_help_parses() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_tiny_checks_pass_and_write_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert main(["--tiny", "--sections", "check", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert len(rows) >= 8 and all(r["ok"] for r in rows)
    assert {r["section"] for r in rows} == {"check"}
