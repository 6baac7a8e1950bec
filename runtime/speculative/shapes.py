"""The size of a verify step's draft tree per algorithm, from the server flags alone (no model):
what the target's verify CUDA graphs are captured for (`verify_graph_nodes`, read by the model
runner at construction on every rank) and a draft model's tree flags with their defaults
(`draft_shape`). It imports nothing that builds a model, so the runner can read it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.kernels.verify_attention import MAX_TREE_NODES
from radixlm.runtime.speculative.draft_tree import DraftShape

if TYPE_CHECKING:
    from radixlm.runtime.server_args import ServerArgs

DEFAULT_NUM_STEPS = 3


def draft_shape(args: ServerArgs) -> DraftShape:
    """The tree flags with their defaults: 3 steps, topk 1 (a chain), every chain node."""
    steps = args.speculative_num_steps or DEFAULT_NUM_STEPS
    return DraftShape.of(steps, args.speculative_eagle_topk or 1, args.speculative_num_draft_tokens)


def verify_graph_nodes(args: ServerArgs) -> int | None:
    """N, the nodes per request of every verify step the proposer of `args` can produce (its
    `num_nodes`), for the target's verify CUDA graphs (executor/verify_graphs.py) captured at its
    construction; None when speculation is off, and for a draft head's target (EAGLE / EAGLE3),
    whose verify graphs need the head's hidden-state capture on: draft_setup.py captures them."""
    algo = args.speculative_algorithm
    nodes = None
    if algo == "NGRAM":
        nodes = args.speculative_num_draft_tokens or args.speculative_ngram_max_match_window_size
    elif algo == "STANDALONE":
        nodes = draft_shape(args).num_nodes
    # NOTE: more than a tree can hold: none (`make_proposer` refuses the flag by name)
    return nodes if nodes is not None and nodes <= MAX_TREE_NODES else None
