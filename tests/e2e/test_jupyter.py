"""The Engine inside a real Jupyter kernel (nbclient): starts, survives Ctrl-C mid-generation
(the request is aborted, the engine keeps serving), shuts down cleanly, and leaves no orphan
process when the kernel dies without a shutdown."""

from __future__ import annotations

import json

import nbformat
from nbclient import NotebookClient

from tests_helpers import pid_alive, wait_until

START = """
import os, signal, threading, time
import radixlm as rl
engine = rl.Engine()
info = engine.get_server_info()
pids = [info["scheduler_pid"], info["detokenizer_pid"]]
print("PIDS", pids)
"""
INTERRUPT = """
def _interrupt_once_running():  # Ctrl-C while the request runs (an event, not a delay)
    while not engine.get_server_info()["num_running"]:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=_interrupt_once_running, daemon=True).start()
engine.generate("Tell me a very long story.", {"max_new_tokens": 3000, "ignore_eos": True})
"""
AFTER = """
deadline = time.time() + 120  # a failsafe: the abort frees the request at the next step
while engine.get_server_info()["num_running"] and time.time() < deadline:
    time.sleep(0.1)
out = engine.generate("Hi", {"max_new_tokens": 4, "ignore_eos": True})
print("AFTER", out["meta_info"]["completion_tokens"], engine.get_server_info()["num_running"])
"""


def _run(cells: list[str], kernel_name: str) -> list[str]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, kernel_name=kernel_name, timeout=600, allow_errors=True).execute()
    out = []
    for cell in nb.cells:
        for o in cell.outputs:
            out.append(o.get("text", "") if o["output_type"] == "stream" else o.get("ename", ""))
    return out


def _pids(outputs: list[str]) -> list[int]:
    line = next(line for o in outputs for line in o.splitlines() if line.startswith("PIDS"))
    return json.loads(line.split(" ", 1)[1])


def _wait_dead(pids: list[int]) -> bool:
    wait_until(lambda: not any(pid_alive(p) for p in pids), f"processes {pids} to exit")
    return True


def test_ctrl_c_aborts_generation_and_shutdown_is_clean(kernel_name) -> None:
    outputs = _run([START, INTERRUPT, AFTER, "engine.shutdown()"], kernel_name)
    assert "KeyboardInterrupt" in outputs
    after = next(o for o in outputs if o.startswith("AFTER"))
    assert after.split() == ["AFTER", "4", "0"]
    assert _wait_dead(_pids(outputs))


def test_kernel_exit_without_shutdown_leaves_no_orphans(kernel_name) -> None:
    outputs = _run(
        [START, "print(engine.generate('Hi', {'max_new_tokens': 2})['text'] is not None)"],
        kernel_name,
    )
    pids = _pids(outputs)
    assert _wait_dead(pids), f"orphaned engine processes: {[p for p in pids if pid_alive(p)]}"
