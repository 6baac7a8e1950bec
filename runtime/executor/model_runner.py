"""`ModelRunner`: owns the model, the KV pool, the `req_to_token` table and the attention backend.

Built by the scheduler process (scheduler/process.py) and passed to the `Scheduler`. The
scheduler's step path (scheduler/step.py) hands it a `ForwardBatch` and gets the final hidden
states of the batch's `logits_indices` rows (`forward`), then float32 logits of the rows it
samples (`compute_logits`); decode batches assemble their inputs in `decode_input_buffer`. The
scheduler reaches the model's tensors only through these calls. One runner per scheduler process;
not thread-safe.

Tensor parallelism (`runtime/distributed/`, the rank's `ParallelState` set before the runner is
built): the runner holds this rank's shard (`local_config`: its heads, its KV pool) and its
construction, `forward` and `compute_logits` are collectives: every rank of the group builds its
runner at the same time and then makes the same calls, in the same order, with the same batch
(and the same `req_to_token` rows); `compute_logits` returns the full-vocabulary logits on every
rank.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import psutil
import torch

from radixlm.kernels.decode_inputs import DECODE_INPUT_ROWS
from radixlm.runtime.attention.base import AttentionBackend, layer_attention
from radixlm.runtime.attention.registry import ATTENTION_BACKENDS
from radixlm.runtime.distributed.comm import all_reduce_min
from radixlm.runtime.distributed.sharding import local_config
from radixlm.runtime.distributed.state import parallel_state
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.executor.graph_capture import Capture
from radixlm.runtime.mem.kv_pool import KVPool, ReqToTokenPool
from radixlm.runtime.models.fp8 import finish_fp8_checkpoint
from radixlm.runtime.models.llama import Linear, LlamaForCausalLM
from radixlm.runtime.models.loader import ModelSource
from radixlm.runtime.models.registry import model_class
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.shapes import verify_graph_nodes

if TYPE_CHECKING:
    from radixlm.runtime.executor.verify_graphs import VerifyGraphRunner

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}
_KV_CACHE_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
CPU_DEFAULT_KV_TOKENS = 65536


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str, device: torch.device, checkpoint_dtype: str) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type == "cpu":
        return torch.float32
    return torch.float16 if checkpoint_dtype == "float16" else torch.bfloat16


def check_fp8_support(args: ServerArgs, capability: tuple[int, int] | None) -> None:
    """FP8 weights or KV need a GPU of compute capability >= 8.9 (Ada, Hopper); `capability` is
    None on CPU, where FP8 is emulated. Raises InvalidRequestError naming the argument."""
    if capability is None or capability >= (8, 9):
        return
    for name, value in (
        ("quantization", args.quantization),
        ("kv_cache_dtype", args.kv_cache_dtype),
    ):
        if value not in (None, "auto"):
            raise InvalidRequestError(
                f"{name}={value!r} needs a GPU of compute capability >= 8.9 (Ada/Hopper); "
                f"this one is {capability[0]}.{capability[1]}",
                name,
            )


def resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The KV pool's element dtype: `auto` is the model dtype; fp8_e4m3 / fp8_e5m2 an FP8 cache."""
    return dtype if kv_cache_dtype == "auto" else _KV_CACHE_DTYPES[kv_cache_dtype]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class ModelRunner:
    # NOTE: the tensor-parallel leader (runtime/distributed/leader.py) records the table's
    # writes for its followers; every other runner uses the plain pool.
    req_to_token_cls: type[ReqToTokenPool] = ReqToTokenPool

    def __init__(
        self,
        args: ServerArgs,
        source: ModelSource,
        on_loaded: Callable[[torch.nn.Module], None] | None = None,
    ) -> None:
        """`on_loaded(model)` runs right after the weights load, before the KV pool, warm-up and
        CUDA graphs (a draft head binds the target's embedding there)."""
        self.args = args = args.resolved()  # NOTE: a no-op in a child (launch resolved them)
        self.config = source.config
        # NOTE: at TP > 1 this rank's model, KV pool and attention have its own head counts and
        # intermediate sizes (runtime/distributed/sharding.py); `config` stays the full model's.
        self.local_config = local_config(source.config, parallel_state())
        self.device = resolve_device(args.device)
        self.dtype = resolve_dtype(args.dtype, self.device, self.config.torch_dtype)
        if self.device.type == "cpu":
            torch.set_num_threads(args.num_threads)
        elif self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        self.context_len = args.context_length or self.config.max_position_embeddings
        cuda = self.device.type == "cuda"
        check_fp8_support(args, torch.cuda.get_device_capability(self.device) if cuda else None)
        self.model = self._load_model(source)
        if on_loaded is not None:
            on_loaded(self.model)
        self.kv_pool, self.req_to_token = self._init_memory()
        self.attn = self._make_attention_backend()
        self.gemm_choices: dict = {}
        if (
            self.device.type == "cuda"
            and self.dtype != torch.float32
            and args.attention_backend != "torch"
        ):
            from radixlm.runtime.models.gemm_select import select_decode_gemms

            self.gemm_choices = select_decode_gemms(self.model, Linear, self.dtype)
            from radixlm.runtime.models.moe import select_moe_kernel_configs

            select_moe_kernel_configs(self.model, self.dtype)  # no-op without MoE layers
        self.graphs = None
        # NOTE: the target of a draft head runs every forward with its hidden-state capture
        # (`set_hidden_capture`): decode graphs would never replay; its verify graphs are
        # captured with the capture on, once the head sets it (draft_setup.py)
        head_target = args.speculative_algorithm in ("EAGLE", "EAGLE3")
        if self.device.type == "cuda" and not args.disable_cuda_graph and not head_target:
            from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner

            max_bs = min(args.cuda_graph_max_bs, self.max_running)
            # NOTE: a draft head's decode steps read features as wide as its hidden size
            width = getattr(self.model, "graph_feature_dim", None)
            features = None if width is None else (width, self.dtype)
            self.graphs = CudaGraphRunner(self.model, self.attn, max_bs, self.device, features)
        self.verify_graphs: VerifyGraphRunner | None = None
        verify_nodes = verify_graph_nodes(args)
        if (
            self.graphs is not None
            and verify_nodes is not None
            and not args.disable_speculative_verify_cuda_graph
        ):
            self.capture_verify_graphs([verify_nodes])
        if self.device.type == "cuda":
            self._warm_extend()

    # ---- setup ---------------------------------------------------------------------------------
    def _load_model(self, source: ModelSource) -> LlamaForCausalLM:
        fused = self.device.type == "cuda" and self.args.attention_backend != "torch"
        model_cls = model_class(self.config.architecture)  # the registry (registry.py)
        with _default_dtype(self.dtype), torch.device(self.device):
            model = model_cls(self.local_config, self.context_len, self.device, fused_ops=fused)
        model.load_weights(
            (name, self._to_model(name, t))
            for name, t in source.iter_weights(self.device, self.dtype)
        )
        cuda = self.device.type == "cuda"
        native_fp8 = cuda and torch.cuda.get_device_capability(self.device) >= (8, 9)
        if any(isinstance(m, Linear) and m.fp8 for m in model.modules()):
            kept = finish_fp8_checkpoint(model, Linear, self.dtype, native_fp8)
            logger.info("fp8 checkpoint: %d linear layers keep their FP8 weights", kept)
        # NOTE: dummy weights of an FP8 checkpoint's config are quantised online, so that they
        # run the FP8 kernels the real checkpoint would.
        dummy_fp8 = source.load_format == "dummy" and self.config.quantization == "fp8"
        if self.args.quantization == "fp8" or (dummy_fp8 and (native_fp8 or not cuda)):
            layers = model.quantize_fp8()
            logger.info(
                "fp8: %d linear layers quantised (weights per channel, inputs per token)", layers
            )
        if cuda:
            torch.cuda.empty_cache()  # weights replaced at load: size the KV pool after
        self.cpu = None
        self.weight_mode = str(self.dtype).replace("torch.", "")
        if self.device.type == "cpu":
            from radixlm.runtime.models.cpu_linear import setup_cpu_model

            # NOTE: the default on CPU (dtype and quantization left unset) for a GGUF file is its
            # own block quants: the fastest mode, and it passes the quality gate
            # (tests/runtime/test_quality_gate.py); dtype="float32" gives the dense fp32 path.
            quantize = self.args.quantization == "gguf" or (
                self.args.quantization is None and self.args.dtype == "auto"
            )
            self.cpu = setup_cpu_model(model, Linear, source.gguf, quantize)
            self.weight_mode = self.cpu.mode
            logger.info("CPU linear layers: %s %s", self.cpu.mode, self.cpu.layers)
            if type(model).compute_logits is not LlamaForCausalLM.compute_logits:
                self.cpu = self.cpu._replace(head=None)  # NOTE: a model's own logits (softcap...)
        elif self.args.quantization == "gguf":
            logger.info("quantization=gguf: on GPU the GGUF weights load de-quantised")
        return model.eval()

    def _to_model(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A checkpoint tensor on the device, in the model dtype; FP8 weights keep their dtype,
        FP8 scales become fp32, integer and bool tensors (an EAGLE-3 head's d2t) keep theirs."""
        if t.dtype == torch.float8_e4m3fn or not (t.is_floating_point() or t.is_complex()):
            return t.to(self.device)
        if name.endswith("_scale"):
            return t.to(self.device, torch.float32)
        return t.to(device=self.device, dtype=self.dtype)

    def _init_memory(self) -> tuple[KVPool, ReqToTokenPool]:
        cfg = self.local_config  # this rank's KV heads
        self.kv_dtype = resolve_kv_cache_dtype(self.args.kv_cache_dtype, self.dtype)
        per_token = KVPool.bytes_per_token(
            cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, self.kv_dtype
        )
        if self.args.max_total_tokens is not None:
            tokens = self.args.max_total_tokens
        elif self.device.type == "cuda":
            fraction = self.args.mem_fraction_static
            total = torch.cuda.get_device_properties(self.device).total_memory
            # NOTE: keep room outside the fraction for activations, logits and CUDA graphs
            # (their memory pool is allocated after the KV pool, out of the remaining share).
            budget = total * fraction - torch.cuda.memory_allocated(self.device)
            # NOTE: a draft model (speculative decoding) is built after this runner, inside the
            # same fraction: its weights and one draft KV token per target token
            from radixlm.runtime.speculative.draft_memory import draft_memory

            draft = draft_memory(self.args, self.dtype, self.kv_dtype, self.config)
            if draft is not None:
                budget -= draft.weight_bytes
            tokens = int(budget // (per_token + (draft.kv_bytes_per_token if draft else 0)))
        else:
            ram_cap = int(psutil.virtual_memory().total * 0.25 // per_token)
            tokens = min(CPU_DEFAULT_KV_TOKENS, ram_cap)
        # NOTE: every rank holds the same number of KV slots (rank 0's scheduler allocates them
        # for all): the smallest any rank can hold (its KV heads may differ, sharding.py).
        tokens = all_reduce_min(tokens)
        if tokens < 64:
            raise MemoryError(f"only {tokens} KV tokens fit; lower the model size or raise memory")
        self.max_running = max(1, min(self.args.max_running_requests, tokens // 2))
        logger.info(
            "KV pool: %d tokens (%.2f GB, %s, kv_cache_dtype=%s); max running requests %d; "
            "context %d",
            tokens,
            tokens * per_token / 1e9,
            self.kv_dtype,
            self.args.kv_cache_dtype,
            self.max_running,
            self.context_len,
        )
        kv = KVPool(
            tokens,
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
            self.kv_dtype,
            self.device,
        )
        if self.model.kv_scales and kv.quantized:
            for layer, (k_scale, v_scale) in self.model.kv_scales.items():
                kv.k_scale[layer], kv.v_scale[layer] = k_scale, v_scale
            logger.info(
                "KV pool: the checkpoint's K/V scales for %d layers", len(self.model.kv_scales)
            )
        elif self.model.kv_scales:
            logger.info("the checkpoint's KV-cache scales are unused (kv_cache_dtype=auto)")
        # NOTE: one spare row per request: a jump-forward or chunk may briefly need it.
        req_to_token = self.req_to_token_cls(self.max_running, self.context_len + 1, self.device)
        return kv, req_to_token

    def _make_attention_backend(self) -> AttentionBackend:
        cfg = self.local_config
        shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        cls = ATTENTION_BACKENDS.load(self.args.attention_backend)
        backend: AttentionBackend = cls(self.kv_pool, self.req_to_token, *shape)
        backend.set_layer_attention(layer_attention(cfg))  # windows, soft caps, scales
        return backend

    def _warm_extend(self) -> None:
        """Compile the extend path's kernels now, not on the first request (runtime/executor/warmup.py)."""
        from radixlm.runtime.executor.warmup import extend_shapes, warm_decode_inputs, warm_extend

        chunk = self.args.chunked_prefill_size
        chunk = self.args.max_prefill_tokens if chunk == -1 else chunk
        capacity = self.kv_pool.allocator.available()
        shapes = extend_shapes(chunk, self.max_running, capacity, self.req_to_token.table.shape[1])
        seconds = warm_extend(self, shapes)
        warm_decode_inputs(self)
        logger.info("extend warm-up: %d shapes in %.2f s of start-up", len(shapes), seconds)

    # ---- forward -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states of the rows `batch.logits_indices` (all rows when None): a decode
        batch replays a decode CUDA graph and a verify batch (`tree_mask`) a verify graph where
        one fits (executor/verify_graphs.py), anything else runs eager."""
        capturing = getattr(self.model, "capture", None) is not None
        if batch.tree_mask is not None:  # a speculative verify step: its graph, if one fits
            if self.verify_graphs is not None and self.verify_graphs.can_run(batch):
                return self.verify_graphs.replay(batch)
        elif self.graphs is not None and not capturing and self.graphs.can_run(batch):
            return self.graphs.replay(batch)  # NOTE: a draft head's target decodes eager
        self.attn.init_forward_metadata(batch)
        return self.model(batch, self.attn)

    def capture_verify_graphs(
        self, node_counts: Sequence[int], max_bs: int | None = None, capture: Capture | None = None
    ) -> None:
        """CUDA graphs for verify forwards of `node_counts` nodes per request, up to `max_bs`
        requests (None: the decode graphs' bound), by `capture` (None: the decode graphs' own,
        into their pool); `forward` then replays them. A no-op without decode graphs or
        `capture`, or with a backend without verify graphs (`build_verify_graphs`). NOTE: at
        TP > 1 only during construction (every rank captures alike there, nothing broadcast)."""
        from radixlm.runtime.executor.verify_graphs import build_verify_graphs

        self.verify_graphs = None  # NOTE: the old graphs' memory goes back to the pool first
        self.verify_graphs = build_verify_graphs(self, node_counts, max_bs, capture)

    @property
    def verify_graph_replays(self) -> int:
        """Verify forwards that replayed a CUDA graph so far."""
        return 0 if self.verify_graphs is None else self.verify_graphs.replays

    def set_hidden_capture(self, layers: tuple[int, ...] | None) -> None:
        """Turn the target's hidden-state capture for a draft head on (`layers`: the model's
        `capture`, see LlamaForCausalLM) or off (None). While on, forwards run eager (no decode
        graph) and `take_hidden` returns each forward's captured rows."""
        if layers is not None and not hasattr(self.model, "_forward_capturing"):
            raise InvalidRequestError(
                f"{self.config.architecture} cannot give hidden states to a draft head",
                "speculative_algorithm",
            )
        self.model.capture = layers
        self.model.captured = None

    def take_hidden(self) -> torch.Tensor | None:
        """The hidden states captured by the last forward ([T, k * H], every row of its batch in
        row order), handed over once; None when capture is off."""
        out, self.model.captured = getattr(self.model, "captured", None), None
        return out

    def decode_input_buffer(self, bs: int) -> torch.Tensor:
        """Where a decode batch of `bs` requests assembles its inputs (`[5, bs]` int64, rows as
        `kernels.decode_inputs.DECODE_INPUT_ROWS`): the CUDA graphs' static inputs when a graph
        will run the batch (replay then copies nothing), else a new tensor."""
        if self.graphs is not None and bs <= self.graphs.max_bs:
            return self.graphs.input_buffer(bs)
        return torch.empty(len(DECODE_INPUT_ROWS), bs, dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def compute_logits(
        self, hidden: torch.Tensor, rows: slice | torch.Tensor | None = None
    ) -> torch.Tensor:
        """float32 logits `[rows, vocab]` of `hidden`'s rows `rows` (a range, or row indices on
        the device; None: every row)."""
        if isinstance(rows, slice):
            hidden = hidden[rows]
        elif rows is not None:
            hidden = hidden.index_select(0, rows)
        if self.cpu is not None and self.cpu.head is not None:
            return self.cpu.head(hidden).float()
        return self.model.compute_logits(hidden)
