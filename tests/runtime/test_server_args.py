"""`ServerArgs`: names checked against the seams' registries, every "auto" default resolved by
`resolved()` (one place), and the user's process kept free of torch while doing it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.attention.registry import ATTENTION_BACKENDS
from radixlm.runtime.constrained.registry import GRAMMAR_BACKENDS
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.mem.prefix_cache import PrefixCache
from radixlm.runtime.mem.registry import PREFIX_CACHES
from radixlm.runtime.models.registry import ARCHITECTURES, MODEL_CLASSES
from radixlm.runtime.registry import Registry
from radixlm.runtime.server_args import ServerArgs


def test_every_registered_implementation_loads_and_implements_its_seam():
    assert ATTENTION_BACKENDS.names() == ("torch", "triton")
    for name in ATTENTION_BACKENDS.names():
        assert issubclass(ATTENTION_BACKENDS.load(name), AttentionBackend)
    assert PREFIX_CACHES.names() == ("radix", "none")
    for name in PREFIX_CACHES.names():
        assert issubclass(PREFIX_CACHES.load(name), PrefixCache)
    assert set(GRAMMAR_BACKENDS.names()) == {"outlines", "llguidance", "xgrammar"}
    for name in GRAMMAR_BACKENDS.names():
        assert callable(GRAMMAR_BACKENDS.load(name))
    assert MODEL_CLASSES.names() == tuple(ARCHITECTURES)


def test_registry_rejects_unknown_and_duplicate_names():
    reg: Registry[type] = Registry("thing")
    reg.register("a", "radixlm.runtime.registry:Registry")
    assert reg.load(reg.check("a", "thing_name")) is Registry
    with pytest.raises(InvalidRequestError, match=r"thing_name must be one of \('a',\), got 'b'"):
        reg.check("b", "thing_name")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a", "x:y")


@pytest.mark.parametrize(
    ("field", "value"), [("attention_backend", "flashinfer"), ("grammar_backend", "guidance-ai")]
)
def test_bad_names_fail_in_the_users_process(field, value):
    with pytest.raises(InvalidRequestError, match=f"{field} must be one of .*got '{value}'") as e:
        ServerArgs(**{field: value})
    assert e.value.field == field
    from radixlm.runtime.frontend.engine import Engine

    with pytest.raises(InvalidRequestError, match=field):  # before any child is started
        Engine(**{field: value})


def test_resolved_fills_every_device_default_once():
    cpu = ServerArgs(device="cpu").resolved()
    assert (cpu.attention_backend, cpu.chunked_prefill_size, cpu.max_running_requests) == (
        "torch",
        2048,
        128,
    )
    assert cpu.num_threads == len(os.sched_getaffinity(0))
    assert (cpu.mem_fraction_static, cpu.cuda_graph_max_bs) == (None, None)  # GPU-only knobs
    gpu = ServerArgs(device="cuda:0").resolved()  # resolving needs no GPU
    assert (gpu.attention_backend, gpu.chunked_prefill_size, gpu.max_running_requests) == (
        "triton",
        8192,
        512,
    )
    assert (gpu.mem_fraction_static, gpu.cuda_graph_max_bs, gpu.num_threads) == (0.85, 256, None)
    assert ServerArgs().resolved().device in ("cpu", "cuda")
    for args in (cpu, gpu):
        assert args.resolved() == args  # idempotent: a child resolving again changes nothing
    mine = ServerArgs(
        device="cpu",
        attention_backend="triton",
        chunked_prefill_size=-1,
        max_running_requests=3,
        num_threads=1,
    ).resolved()
    assert (mine.attention_backend, mine.chunked_prefill_size) == ("triton", -1)
    assert (mine.max_running_requests, mine.num_threads) == (3, 1)


@pytest.mark.skipif(
    "+cpu" not in importlib.metadata.version("torch"), reason="a CUDA build asks torch"
)
def test_resolving_does_not_import_torch_in_the_users_process():
    code = (
        "import sys\n"
        "from radixlm.runtime.server_args import ServerArgs\n"
        "assert ServerArgs().resolved().device == 'cpu'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"tp_size": 0}, "tp_size"),
        ({"nnodes": 2}, "dist_init_addr"),
        ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "127.0.0.1:5000"}, "node_rank"),
        ({"tp_size": 3, "nnodes": 2, "dist_init_addr": "127.0.0.1:5000"}, "tp_size"),
        ({"speculative_algorithm": "MEDUSA"}, "speculative_algorithm"),
        ({"speculative_algorithm": "EAGLE"}, "speculative_draft_model_path"),
        ({"speculative_num_steps": 0}, "speculative_num_steps"),
        ({"speculative_ngram_min_match_window_size": 5,
          "speculative_ngram_max_match_window_size": 2}, "speculative_ngram_min_match_window_size"),
    ],
)  # fmt: skip
def test_parallel_and_speculative_flags_are_checked_by_name(kwargs, field):
    with pytest.raises(InvalidRequestError) as err:
        ServerArgs(**kwargs)
    assert err.value.field == field


@pytest.mark.parametrize("algo", ["NGRAM", "STANDALONE", "EAGLE", "EAGLE3"])
def test_speculation_is_accepted_at_tp_above_one(algo):
    path = None if algo == "NGRAM" else "/some/draft"
    args = ServerArgs(speculative_algorithm=algo, speculative_draft_model_path=path, tp_size=2)
    assert args.tp_size == 2 and args.speculative_algorithm == algo


def test_cpu_threads_are_shared_by_a_nodes_tensor_parallel_ranks():
    cores = len(os.sched_getaffinity(0))
    assert ServerArgs(device="cpu").resolved().num_threads == cores
    assert ServerArgs(device="cpu", tp_size=2).resolved().num_threads == max(1, cores // 2)
    two_nodes = ServerArgs(device="cpu", tp_size=4, nnodes=2, dist_init_addr="10.0.0.1:5000")
    assert two_nodes.resolved().num_threads == max(1, cores // 2)
    assert ServerArgs(device="cpu", tp_size=2, num_threads=3).resolved().num_threads == 3


def test_xgrammar_backend_without_the_package_is_refused_by_name(monkeypatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "xgrammar" else find_spec(name, *a),
    )
    with pytest.raises(InvalidRequestError, match=r"radixlm\[xgrammar\]") as err:
        ServerArgs(model_path="tiny-llama", grammar_backend="xgrammar")
    assert err.value.field == "grammar_backend"
    ServerArgs(model_path="tiny-llama", grammar_backend="llguidance")  # the default needs nothing
