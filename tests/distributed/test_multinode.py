"""Multi-node start-up with SGLang's flags, two "nodes" on 127.0.0.1: `radixlm serve --tp-size 2
--nnodes 2 --node-rank 0 --dist-init-addr 127.0.0.1:P` (the HTTP server, rank 0) and the same
with `--node-rank 1` (rank 1 only, no HTTP server), started as separate processes. Greedy output
over HTTP equals TP=1's, and when node 0 stops in order node 1 exits 0. On a second pair, SIGKILL
of node 1's rank while a request decodes: that request ends with an error naming rank 1 within
seconds, later requests get 503 naming it, and node 1's process exits with an error.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import httpx
import psutil
import pytest

from server_process import ServerProcess, free_port
from tests_helpers import PARITY_PROMPTS, get_engine, release_engine, wait_until

CONFIG = {"device": "cpu", "dtype": "float32", "num_threads": 1}
FLAGS = ["--device", "cpu", "--dtype", "float32", "--num-threads", "1", "--tp-size", "2",
         "--nnodes", "2"]  # fmt: skip
PARAMS = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
PROMPTS = PARITY_PROMPTS[:2]


@pytest.fixture
def nodes() -> Any:
    addr = f"127.0.0.1:{free_port()}"
    common = [*FLAGS, "--dist-init-addr", addr]
    node0 = ServerProcess(*common, "--node-rank", "0")
    node1 = ServerProcess(*common, "--node-rank", "1")
    try:
        node0.wait_ready()
        yield node0, node1
    finally:
        node0.close()
        node1.close()


def test_two_nodes_match_tp1_and_stop_in_order(nodes: tuple[ServerProcess, ServerProcess]) -> None:
    node0, node1 = nodes
    assert node0.info()["tp_size"] == 2
    assert node1.proc.poll() is None
    engine = get_engine(**CONFIG)
    try:
        want = [o["output_ids"] for o in engine.generate(PROMPTS, PARAMS)]
    finally:
        release_engine(**CONFIG)
    for prompt, ids in zip(PROMPTS, want):
        resp = node0.client.post("/generate", json={"text": prompt, "sampling_params": PARAMS})
        assert resp.status_code == 200, resp.text
        assert resp.json()["output_ids"] == ids
    assert node0.stop() == 0
    assert node1.proc.wait(30) == 0, node1.logs()[-2000:]


def test_killed_rank_on_node1_stops_the_group(nodes: tuple[ServerProcess, ServerProcess]) -> None:
    node0, node1 = nodes
    rank1 = psutil.Process(node1.proc.pid).children()[0]
    outcome: dict[str, Any] = {}

    def client() -> None:
        body = {"text": "Once upon a time", "sampling_params": {**PARAMS, "max_new_tokens": 400}}
        try:
            outcome["resp"] = node0.client.post("/generate", json=body, timeout=60)
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    before = node0.info()["generated_tokens"]
    thread = threading.Thread(target=client)
    thread.start()
    wait_until(lambda: node0.info()["generated_tokens"] != before, "the request decoding")
    rank1.send_signal(signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive(), "the client hangs after a rank was killed"
    resp = outcome.get("resp")
    assert resp is not None and resp.status_code == 503, outcome
    assert "rank 1" in resp.text, resp.text
    later = node0.client.post("/generate", json={"text": "Hi", "sampling_params": PARAMS})
    assert later.status_code == 503 and "rank 1" in later.text, later.text
    assert node1.proc.wait(30) == 1
    assert "rank 1" in node1.logs()
