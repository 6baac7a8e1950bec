"""From the server flags to a `Proposer`: the one place an algorithm is chosen, given its defaults,
or refused by name at start-up.

`make_proposer(args, runner)` -> `Proposer | None` (None: speculation off). The scheduler calls it
once, at start-up, with the target's `ModelRunner` (a draft model or an EAGLE head needs its
device, dtype, config and, for EAGLE, its embedding and LM head). Defaults follow SGLang's for
NGRAM: `num_draft_tokens` = the max match window (12), breadth (`--speculative-eagle-topk`) 10
(on CPU with the cost-aware gate, the first candidate's chain takes the budget first, ngram.py);
STANDALONE / EAGLE / EAGLE3: shapes.py (3 steps, topk 1, every node of the chain).
"""

from __future__ import annotations

from typing import Any

from radixlm.kernels.verify_attention import MAX_TREE_NODES
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.proposer import Proposer

NGRAM_DEFAULT_BREADTH = 10  # SGLang's speculative_ngram_max_bfs_breadth


def make_proposer(args: ServerArgs, runner: Any) -> Proposer | None:
    """The proposer for `args.speculative_algorithm` (None when it is not set)."""
    algo = args.speculative_algorithm
    if algo is None:
        return None
    if algo == "NGRAM":
        from radixlm.runtime.speculative.ngram import NgramProposer

        hi = args.speculative_ngram_max_match_window_size
        nodes = args.speculative_num_draft_tokens or hi
        if nodes > MAX_TREE_NODES:
            raise InvalidRequestError(
                f"speculative_num_draft_tokens must be at most {MAX_TREE_NODES}",
                "speculative_num_draft_tokens",
            )
        cpu = runner is not None and runner.device.type == "cpu"
        return NgramProposer(
            num_nodes=nodes,
            min_window=args.speculative_ngram_min_match_window_size,
            max_window=hi,
            breadth=args.speculative_eagle_topk or NGRAM_DEFAULT_BREADTH,
            reserve_alternates=not cpu or args.speculative_verify_all,
        )
    from radixlm.runtime.speculative.draft_setup import build_draft_proposer
    from radixlm.runtime.speculative.shapes import draft_shape

    if draft_shape(args).num_nodes > MAX_TREE_NODES:
        raise InvalidRequestError(
            f"speculative_num_draft_tokens must be at most {MAX_TREE_NODES}",
            "speculative_num_draft_tokens",
        )
    return build_draft_proposer(args, runner)  # STANDALONE, EAGLE, EAGLE3 (draft_setup.py)
