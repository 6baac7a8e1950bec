"""The checkout's root is the `radixlm` package's folder: Python started there (`python -m pytest`,
`python -m radixlm`, a child process inheriting the working directory) has that folder on
`sys.path`, where `kernels/`, `runtime/`, `bench/` ... would shadow top-level modules of the same
names. transformers >= 5.25 imports PyPI's `kernels`; importing radixlm moves the folder last."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib.util, sys
assert sys.path[0] == '', sys.path[:2]          # `python -c` from the root: the root is on sys.path
before = importlib.util.find_spec('kernels')
import radixlm
after = importlib.util.find_spec('kernels')
print(before.origin if before else None)
print(after.origin if after else None)
"""


def test_importing_radixlm_unshadows_top_level_modules() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    before, after = out[0], out[1]
    ours = str(ROOT / "kernels" / "__init__.py")
    assert before == ours  # the shadow the probe starts from
    try:
        importlib.metadata.distribution("kernels")  # PyPI's (transformers >= 5.25 needs it)
    except importlib.metadata.PackageNotFoundError:
        return
    assert after != ours
