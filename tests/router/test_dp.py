"""`radixlm serve --dp-size 2`: two replicas (each its own engine processes) behind one endpoint
(API key on), on the tiny random-weight model (real tokenizer): what is checked is the plumbing, not the text."""

from __future__ import annotations

import sys

import httpx
import openai
import psutil
import pytest

from radixlm.router.dp import replica_argv
from radixlm.runtime.models.default_model import default_model_path
from radixlm.runtime.server.launch_server import build_parser
from radixlm.runtime.server_args import ServerArgs
from server_process import ServerProcess

TINY_MODEL_ARGS = (
    "--model-path", "tiny-smollm", "--load-format", "dummy",
    "--tokenizer-path", default_model_path(), "--num-threads", "1",
)  # fmt: skip


def test_replica_flags_reproduce_the_server_args():
    args = ServerArgs(model_path="m", dp_size=3, port=4000, host="0.0.0.0", max_total_tokens=999,
                      log_requests=False, disable_radix_cache=True, max_prefill_tokens=512)  # fmt: skip
    argv = replica_argv(args, 1234)
    replica = ServerArgs.from_cli_args(build_parser().parse_args(argv))
    assert replica == args.replace(host="127.0.0.1", port=1234, dp_size=1)


def test_dp_size_must_be_positive():
    with pytest.raises(ValueError, match="dp_size"):
        ServerArgs(dp_size=0)


def test_dp_size_two_serves_one_endpoint_and_stops_its_replicas():
    cli = [sys.executable, "-m", "radixlm.cli", "serve"]
    server = ServerProcess(*TINY_MODEL_ARGS, "--dp-size", "2", api_key="dp-key", command=cli)
    try:
        server.wait_ready()
        parent = psutil.Process(server.proc.pid)
        assert len(parent.children()) == 2  # the replicas; their engines below them
        family = parent.children(recursive=True)
        workers = server.client.get("/workers").json()["workers"]
        assert len(workers) == 2 and all(w["healthy"] for w in workers)
        # the key is checked by the router and forwarded to the replicas, which check it too
        assert httpx.get(server.base_url + "/v1/models").status_code == 401
        for w in workers:
            assert httpx.get(w["url"] + "/v1/models").status_code == 401
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="dp-key")
        served = set()
        for i in range(4):  # distinct prompts: cache misses go to the emptier replica
            raw = client.completions.with_raw_response.create(
                model="m", prompt=f"Document {i}: " + "words " * (20 + i), max_tokens=2
            )
            assert raw.parse().choices[0].finish_reason in ("length", "stop")
            served.add(raw.headers["x-radixlm-worker"])
        assert served == {w["url"] for w in workers}
        assert server.stop() == 0
        _, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, f"processes left behind: {alive}"
    finally:
        server.close()
