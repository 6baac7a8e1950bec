"""`radixlm demo` as a user runs it (README: `./dev run` execs `python -m radixlm demo`): the
environment's console script, in a process of its own, on the default model. It must exit 0
after generating plainly and streaming, running the language example, and reporting the radix
cache's savings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_radixlm_demo_console_script_runs_end_to_end():
    script = os.path.join(os.path.dirname(sys.executable), "radixlm")
    assert os.access(script, os.X_OK), f"the console script is not installed: {script}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [script, "demo", "--prompt", "The capital of France is", "--max-new-tokens", "4"],
        capture_output=True, text=True, timeout=540, env=env,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-3000:])
    assert "engine ready in" in out and "SmolLM2-135M-Instruct" in out
    assert "> The capital of France is" in out and "(4 tokens in" in out
    assert "streaming:" in out and "a generation program (examples/quickstart.py):" in out
    assert "radix cache:" in out and "prompt tokens served from cache" in out
