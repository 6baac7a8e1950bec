"""Building a draft-model proposer from the server arguments (`--speculative-algorithm STANDALONE /
EAGLE / EAGLE3`, `--speculative-draft-model-path`, the tree flags) next to the target's runner.

The draft gets a `ModelRunner` of its own, built from the target's arguments with the draft's
path and: a KV pool of the target's slots plus `max_running * topk * num_steps` for tree nodes
(the draft holds at most the running requests' tokens, which the target's pool also holds;
where it runs out, requests propose less), `topk` `req_to_token` rows per running request, a
context `num_steps + 1` longer (tree nodes past the last position), and CUDA graphs for its draft
steps up to `topk` x the target's graph batch bound (a head's with a static feature input,
cuda_graph_runner.py).
An EAGLE head is bound to the target's token embedding and logits, and the target captures the
hidden states the head reads (`ModelRunner.set_hidden_capture`). On GPU the target's KV pool is
sized with the draft in the budget (`draft_memory`): its weights and its KV per token.

At tp_size > 1 the draft is neither sharded nor replicated: it lives on rank 0 alone, built and
run as a single rank (`single_rank`: plain layers, whole tensors, no collective). Rank 0 is the
one decider (runtime/distributed/lockstep.py): it drafts, and only the verify step, an ordinary
lock-step message, reaches the other ranks. Why not shard it over the target's ranks: a draft is
small by design, so its steps are latency-bound and a sharded draft would pay two all-reduces
per layer per draft step for matmuls too small to split; every follower would also need the
draft's own lock-step protocol (catch-up, expansion, held slots) and a second KV pool kept in
step. Why not replicate it: the followers would only repeat rank 0's computation to discard it.
KV accounting: the draft's pool and rows exist on rank 0 only (nothing on another rank can
drift); the target's accounting is rank 0's alone as at any TP size, and every rank sizes the
target's pool with the draft in the budget (`draft_memory`, then the group's minimum), so the
ranks' capacities agree. The cost: rank 0's device holds the draft's weights and KV (the others
leave that room unused) and drafting does not get faster with more ranks. A draft head reads
rank-0 copies of the target's whole embedding and LM head, gathered once from every rank's
vocabulary rows (runtime/distributed/head_parts.py), and the target's hidden-state capture is set
on every rank alike (a lock-step message), so that every rank runs the same layer path.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from radixlm.kernels.verify_attention import MAX_TREE_NODES
from radixlm.runtime.distributed.state import single_rank
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.models.default_model import ModelNotFoundError
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.models.registry import UnsupportedModelError
from radixlm.runtime.speculative.draft_memory import DRAFT_ALGORITHMS
from radixlm.runtime.speculative.draft_worker import DraftModelProposer
from radixlm.runtime.speculative.shapes import draft_shape

if TYPE_CHECKING:
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.server_args import ServerArgs

HEAD_ARCHITECTURES = {"EAGLE": "LlamaForCausalLMEagle", "EAGLE3": "LlamaForCausalLMEagle3"}


def build_draft_proposer(args: ServerArgs, target: ModelRunner) -> DraftModelProposer:
    """The proposer for `args.speculative_algorithm` (one of DRAFT_ALGORITHMS). Raises
    InvalidRequestError naming the flag when the draft does not fit the algorithm or the target."""
    from radixlm.runtime.distributed.leader import LeaderModelRunner
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.models.eagle import DraftHead

    algo = args.speculative_algorithm
    if algo not in DRAFT_ALGORITHMS:
        raise InvalidRequestError(
            f"{algo!r} is not a draft-model algorithm", "speculative_algorithm"
        )
    path = args.speculative_draft_model_path
    # NOTE: `--load-format dummy` (random weights for speed tests) gives a STANDALONE draft random
    # weights of its config too; a draft head always loads its checkpoint.
    dummy = args.load_format == "dummy" and algo == "STANDALONE"
    try:
        source = resolve_model(path, "dummy" if dummy else "auto")
    except (ModelNotFoundError, UnsupportedModelError) as err:
        raise InvalidRequestError(
            f"speculative_draft_model_path: {err}", "speculative_draft_model_path"
        ) from err
    arch = source.config.architecture
    want = HEAD_ARCHITECTURES.get(algo)
    if want is not None and arch == "LlamaForCausalLM":
        # NOTE: the EAGLE authors' own checkpoints name the plain Llama class: under EAGLE /
        # EAGLE3 such a draft is read as the head (its tensors decide whether it is one)
        source = dataclasses.replace(
            source, config=dataclasses.replace(source.config, architecture=want)
        )
        arch = want
    if want is not None and arch != want:
        raise InvalidRequestError(
            f"speculative_algorithm {algo} needs a {want} draft head; {path} is {arch}",
            "speculative_draft_model_path",
        )
    if want is None and arch in HEAD_ARCHITECTURES.values():
        raise InvalidRequestError(
            f"{path} is a draft head ({arch}): use speculative_algorithm "
            f"{'EAGLE3' if arch.endswith('3') else 'EAGLE'}",
            "speculative_draft_model_path",
        )
    if source.config.vocab_size != target.config.vocab_size:
        raise InvalidRequestError(
            f"the draft's vocabulary ({source.config.vocab_size}) differs from the target's "
            f"({target.config.vocab_size})",
            "speculative_draft_model_path",
        )
    shape = draft_shape(args)
    eagle = want is not None
    extra = target.max_running * shape.topk * shape.num_steps
    # NOTE: a draft step runs `topk` rows per request: graphs up to the target's bound times topk
    graph_bs = min(args.resolved().cuda_graph_max_bs or target.max_running, target.max_running)
    draft_args = args.replace(
        model_path=path,
        load_format=source.load_format,
        quantization=None if eagle else args.quantization,
        speculative_algorithm=None,
        speculative_draft_model_path=None,
        max_total_tokens=target.kv_pool.num_slots + extra,
        max_running_requests=target.max_running * shape.topk,
        context_length=target.context_len + shape.num_steps + 1,
        cuda_graph_max_bs=graph_bs * shape.topk,
    )

    parts = (target.model.embed_tokens, target.compute_logits)
    if eagle and isinstance(target, LeaderModelRunner):
        parts = target.whole_vocab_parts()  # NOTE: a collective: before `single_rank`

    def bind(model) -> None:
        if isinstance(model, DraftHead):
            model.bind_target(*parts)

    try:
        # NOTE: at tp_size > 1 the draft lives on rank 0 alone (module docstring)
        with single_rank():
            runner = ModelRunner(draft_args, source, on_loaded=bind)
    except (KeyError, ValueError) as err:  # the checkpoint's tensors are not the format's
        if not eagle or isinstance(err, InvalidRequestError):
            raise
        raise InvalidRequestError(
            f"{path} is not an {algo} draft head ({want}): {err}", "speculative_draft_model_path"
        ) from err
    if eagle:
        target.set_hidden_capture(runner.model.capture_layers(target.config.num_hidden_layers))
        capture_head_target_graphs(args, target, shape.num_nodes, graph_bs)
    return DraftModelProposer(runner, shape, eagle)


def capture_head_target_graphs(
    args: ServerArgs, target: ModelRunner, nodes: int, max_bs: int
) -> None:
    """A draft head's target verifies through CUDA graphs captured with its hidden-state capture
    on (executor/verify_graphs.py), up to `max_bs` requests of `nodes` nodes, in a graph pool of
    its own (it has no decode graphs: its decode steps run eager). Only on a GPU, without
    `--disable-speculative-verify-cuda-graph`, and at tp_size 1: at tp_size > 1 the capture reaches the
    other ranks as a lock-step message after their construction, and every rank must capture
    alike, so the verify steps stay eager there."""
    if (
        target.device.type != "cuda"
        or args.disable_cuda_graph
        or args.disable_speculative_verify_cuda_graph
        or args.tp_size > 1
        or nodes > MAX_TREE_NODES
    ):
        return
    from radixlm.runtime.executor.graph_capture import GraphCapture

    target.capture_verify_graphs([nodes], max_bs, GraphCapture(target.device))
