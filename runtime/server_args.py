"""`ServerArgs`: every knob of the engine and server, with SGLang's names where one exists.

Frozen once built; `Engine(**kwargs)` and `radixlm serve --flags` both end up here. Unknown names
raise a TypeError naming them; invalid values raise `InvalidRequestError` naming the field. Names
of seam implementations are checked against the seams' registries (attention and grammar
backends; the prefix cache has no name option: `disable_radix_cache` picks its "none" entry).

"None means auto": `resolved()` fills every default that depends on the device (device, attention
backend, chunk size, memory fraction, max running requests, CUDA-graph batch sizes, CPU threads),
here and nowhere else. `launch_processes` calls it before any child starts, so every child reads
the same values; the model runner and the scheduler call it too, for the ones built in-process
(a no-op on a child's resolved args). What needs the checkpoint or the free memory is derived at load by the model runner:
`dtype` / `kv_cache_dtype` "auto", `context_length` (the model's) and `max_total_tokens` (what fits),
and `max_running_requests` is then capped at half the KV pool's tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass, fields
from typing import Any

from radixlm.runtime.attention.registry import ATTENTION_BACKENDS
from radixlm.runtime.constrained.registry import GRAMMAR_BACKENDS
from radixlm.runtime.errors import InvalidRequestError

SCHEDULE_POLICIES = ("lpm", "fcfs", "random", "lof")
LOAD_FORMATS = ("auto", "gguf", "safetensors", "dummy")
DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16", "half", "float")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
QUANTIZATIONS = ("fp8", "gguf")
SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE", "EAGLE", "EAGLE3")


@dataclass(frozen=True)
class ServerArgs:
    # ---- model ----
    model_path: str | None = None  # None: the default SmolLM2-135M-Instruct GGUF
    tokenizer_path: str | None = None
    load_format: str = "auto"
    dtype: str = "auto"  # auto: float32 on CPU, the checkpoint's half type (or bf16) on GPU
    device: str | None = None  # None: cuda when available, else cpu
    context_length: int | None = None
    skip_tokenizer_init: bool = False
    served_model_name: str | None = None
    # OpenAI tool calls in the model's format (SGLang's names; runtime/server/tool_parsers.py)
    tool_call_parser: str | None = None
    # <think>...</think> -> reasoning_content (runtime/server/reasoning_parsers.py)
    reasoning_parser: str | None = None
    random_seed: int | None = None
    # fp8: Linear weights quantized to float8_e4m3 at load (a scale per output channel) and
    # activations per token at run time (GPU: cuBLASLt FP8 GEMMs; see runtime/models/fp8.py).
    # gguf: a GGUF file's Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K linear weights stay quantised on CPU and
    # the CPU kernels compute on them (runtime/models/cpu_linear.py); on GPU they load de-quantised.
    quantization: str | None = None
    # ---- memory and scheduling ---- (defaults that depend on the device: `resolved()`)
    # GPU: fraction of device memory for weights + KV (None: 0.85)
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None  # KV pool size in tokens (CPU default: 65536)
    kv_cache_dtype: str = "auto"  # auto: the model dtype; fp8_e4m3 / fp8_e5m2 halve KV bytes
    max_running_requests: int | None = None  # None: 512 on GPU, 128 on CPU (capped by the pool)
    max_queued_requests: int | None = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = None  # None: 8192 on GPU, 2048 on CPU; -1 disables
    schedule_policy: str = "lpm"
    schedule_conservativeness: float = 1.0
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False  # see runtime/scheduler/overlap.py (CUDA only)
    # Run the overlapped schedule on CPU too (tests: no gain there, tokens arrive a step later).
    overlap_schedule_on_cpu: bool = False
    stream_interval: int = 1
    # ---- kernels ----
    attention_backend: str | None = None  # None: triton on GPU, torch on CPU
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None  # None: 256 (capped by max running requests)
    num_threads: int | None = None  # CPU: torch intra-op threads per rank (None: cores / ranks)
    # ---- constrained decoding ----
    grammar_backend: str = "llguidance"
    disable_jump_forward: bool = False
    grammar_compile_timeout: float = 30.0
    grammar_cache_dir: str | None = None
    constrained_json_whitespace_pattern: str | None = None
    # ---- server ----
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    log_level: str = "info"
    log_requests: bool = True
    enable_metrics: bool = True
    request_timeout: float | None = None  # seconds per request (None: no limit)
    queue_timeout: float | None = None  # seconds a request may wait before it starts
    max_request_body_bytes: int = 8 * 1024 * 1024
    shutdown_timeout: float = 30.0
    watchdog_timeout: float = 300.0
    # ---- parallelism ----
    dp_size: int = 1  # `radixlm serve`: replicas behind one endpoint and the router (router/dp.py)
    tp_size: int = 1  # tensor parallelism: ranks per replica (runtime/distributed/)
    nnodes: int = 1  # nodes the tp ranks span (SGLang's multi-node start-up)
    node_rank: int = 0  # this node's index in 0..nnodes-1
    dist_init_addr: str | None = None  # "host:port" of rank 0's rendezvous (None: loopback)
    # ---- speculative decoding ---- (runtime/speculative/; SGLang's names)
    speculative_algorithm: str | None = None  # None (off), NGRAM, STANDALONE, EAGLE, EAGLE3
    speculative_draft_model_path: str | None = None  # STANDALONE / EAGLE / EAGLE3 draft weights
    speculative_num_steps: int | None = None  # draft steps (tree depth) per verify
    speculative_eagle_topk: int | None = None  # branches per draft step (1: a chain)
    speculative_num_draft_tokens: int | None = None  # tokens verified per request and step
    speculative_ngram_min_match_window_size: int = 1  # NGRAM: shortest suffix matched
    speculative_ngram_max_match_window_size: int = 12  # NGRAM: longest suffix matched
    # Verify every draft (within the CPU row budget) instead of the cost-aware choice of what
    # pays (runtime/speculative/gate.py): tests and acceptance measurements. radixlm's own flag.
    speculative_verify_all: bool = False
    # Run the speculative verify step eager instead of replaying its CUDA graphs
    # (runtime/executor/verify_graphs.py; decode graphs stay on). radixlm's own flag.
    disable_speculative_verify_cuda_graph: bool = False

    def __post_init__(self) -> None:
        if self.load_format not in LOAD_FORMATS:
            raise InvalidRequestError(f"load_format must be one of {LOAD_FORMATS}", "load_format")
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"dtype must be one of {DTYPES}", "dtype")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise InvalidRequestError(
                f"schedule_policy must be one of {SCHEDULE_POLICIES}", "schedule_policy"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidRequestError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}", "kv_cache_dtype"
            )
        if self.quantization not in (None, *QUANTIZATIONS):
            raise InvalidRequestError(
                f"quantization must be one of {QUANTIZATIONS} or None", "quantization"
            )
        if self.attention_backend is not None:
            ATTENTION_BACKENDS.check(self.attention_backend, "attention_backend")
        if self.mem_fraction_static is not None and not 0.05 <= self.mem_fraction_static <= 0.99:
            raise InvalidRequestError(
                "mem_fraction_static must be in [0.05, 0.99]", "mem_fraction_static"
            )
        for name in (
            "max_total_tokens",
            "max_running_requests",
            "max_queued_requests",
            "context_length",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive integer", name)
        if (
            self.chunked_prefill_size is not None
            and self.chunked_prefill_size != -1
            and (self.chunked_prefill_size < 1)
        ):
            raise InvalidRequestError(
                "chunked_prefill_size must be >= 1 or -1", "chunked_prefill_size"
            )
        GRAMMAR_BACKENDS.check(self.grammar_backend, "grammar_backend")
        if self.grammar_backend == "xgrammar" and importlib.util.find_spec("xgrammar") is None:
            raise InvalidRequestError(
                "grammar_backend xgrammar needs the xgrammar package: "
                "pip install 'radixlm[xgrammar]'",
                "grammar_backend",
            )
        for name in ("request_timeout", "queue_timeout", "grammar_compile_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:  # NOTE: also rejects NaN
                raise InvalidRequestError(f"{name} must be a positive number of seconds", name)
        if not self.shutdown_timeout >= 0:
            raise InvalidRequestError("shutdown_timeout must be >= 0 seconds", "shutdown_timeout")
        from radixlm.runtime.server.reasoning_parsers import REASONING_PARSERS
        from radixlm.runtime.server.tool_parsers import TOOL_CALL_PARSERS

        if self.reasoning_parser not in (None, *REASONING_PARSERS):
            raise InvalidRequestError(
                f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}", "reasoning_parser"
            )
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise InvalidRequestError(
                f"tool_call_parser must be one of {sorted(TOOL_CALL_PARSERS)}", "tool_call_parser"
            )
        if self.stream_interval < 1:
            raise InvalidRequestError("stream_interval must be >= 1", "stream_interval")
        if not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise InvalidRequestError("dp_size must be a positive integer", "dp_size")
        for name in ("tp_size", "nnodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidRequestError(f"{name} must be a positive integer", name)
        if not isinstance(self.node_rank, int) or not 0 <= self.node_rank < self.nnodes:
            raise InvalidRequestError("node_rank must be in 0..nnodes-1", "node_rank")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise InvalidRequestError(
                "nnodes > 1 needs dist_init_addr (host:port)", "dist_init_addr"
            )
        if self.tp_size % self.nnodes:
            raise InvalidRequestError("tp_size must be a multiple of nnodes", "tp_size")
        self._check_speculative()
        if not 0 < self.port < 65536:
            raise InvalidRequestError("port must be in 1..65535", "port")

    def _check_speculative(self) -> None:
        algo = self.speculative_algorithm
        if algo is not None and algo not in SPECULATIVE_ALGORITHMS:
            raise InvalidRequestError(
                f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS} or None",
                "speculative_algorithm",
            )
        if algo in ("STANDALONE", "EAGLE", "EAGLE3") and not self.speculative_draft_model_path:
            raise InvalidRequestError(
                f"speculative_algorithm {algo} needs speculative_draft_model_path",
                "speculative_draft_model_path",
            )
        # NOTE: every algorithm runs at tp_size > 1: rank 0 drafts and decides alone, a tree
        # verify step is one lock-step message (runtime/distributed/lockstep.py's VERIFY).
        for name in ("speculative_num_steps", "speculative_eagle_topk",
                     "speculative_num_draft_tokens"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive integer", name)
        lo = self.speculative_ngram_min_match_window_size
        hi = self.speculative_ngram_max_match_window_size
        if not 1 <= lo <= hi:
            raise InvalidRequestError(
                "speculative_ngram_min/max_match_window_size: need 1 <= min <= max",
                "speculative_ngram_min_match_window_size",
            )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServerArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> ServerArgs:
        return dataclasses.replace(self, **changes)

    # ---- "None means auto" ----------------------------------------------------------------------
    def resolved(self) -> ServerArgs:
        """A copy with every device-dependent default filled in (see the module docstring);
        idempotent. Explicit values are kept; -1 still disables chunked prefill."""
        device = self.device or default_device()
        cuda = device.split(":")[0] == "cuda"
        threads = self.num_threads
        if not cuda and not threads:
            # all the cores this process may use, shared by this node's tensor-parallel ranks
            ranks = max(1, self.tp_size // max(1, self.nnodes))
            threads = max(1, len(os.sched_getaffinity(0)) // ranks)
        return self.replace(
            device=device,
            attention_backend=self.attention_backend or ("triton" if cuda else "torch"),
            chunked_prefill_size=self.chunked_prefill_size or (8192 if cuda else 2048),
            mem_fraction_static=self.mem_fraction_static or (0.85 if cuda else None),
            max_running_requests=self.max_running_requests or (512 if cuda else 128),
            cuda_graph_max_bs=self.cuda_graph_max_bs or (256 if cuda else None),
            num_threads=threads,
        )

    # ---- CLI ----------------------------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        """One `--kebab-case` flag per field (bools are store_true flags)."""
        for f in fields(ServerArgs):
            flag = "--" + f.name.replace("_", "-")
            default = f.default
            if isinstance(default, bool):
                parser.add_argument(flag, action="store_true", default=default)
                continue
            kind = _cli_type(f.type)
            parser.add_argument(
                flag, type=kind, default=default, metavar=f.name.upper(), help=_HELP.get(f.name)
            )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


# `--help` text of the flags that bound load (docs/reliability.md).
_HELP = {
    "max_total_tokens": "KV pool size in tokens; prompt + max_new_tokens above it is a 400",
    "context_length": "max prompt + output tokens per request (default: the model's)",
    "max_queued_requests": "max requests held at once, running or waiting; beyond it 429",
    "request_timeout": "seconds a request may run; after it 504 and the request is aborted",
    "queue_timeout": "seconds a request may wait before it starts; after it 429 (shed)",
    "max_request_body_bytes": "larger request bodies get 413",
    "shutdown_timeout": "seconds in-flight requests get to finish on SIGTERM/SIGINT",
    "dp_size": "replicas (each its own engine) behind one endpoint, routed cache-aware",
    "tp_size": "tensor-parallel ranks per replica (NCCL on GPU, gloo on CPU)",
    "nnodes": "nodes the tensor-parallel ranks span (tp_size / nnodes ranks each)",
    "node_rank": "this node's index: 0 runs the HTTP server and rank 0, others run followers only",
    "dist_init_addr": "host:port of rank 0's rendezvous, reachable from every node",
    "speculative_algorithm": "NGRAM, STANDALONE, EAGLE or EAGLE3 (default: off)",
}


def default_device() -> str:
    """ "cuda" when torch sees a CUDA device, else "cpu". A CPU-only torch build (version "+cpu")
    answers without importing torch: the user's process never needs it otherwise (~1.5 s here)."""
    try:
        if "+cpu" in importlib.metadata.version("torch"):
            return "cpu"
    except importlib.metadata.PackageNotFoundError:
        pass
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cli_type(annotation: Any) -> type:
    text = str(annotation)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str
