"""The NGRAM proposer: the index is incremental and equal to one built from scratch; lookup finds
the longest window first and the most recent occurrence first; candidates merge into a trie
within the budget (a chain for one candidate); a rewritten tail (jump-forward) rebuilds the index;
the server flags give SGLang's defaults; the draft checks cut by depth and by grammar."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.speculative.draft_check import check_draft
from radixlm.runtime.speculative.ngram import NgramIndex, NgramProposer, merge_candidates
from radixlm.runtime.speculative.setup import make_proposer
from radixlm.runtime.speculative.tree import check_parents
from radixlm.runtime.speculative.tree_accept import DraftKind


def test_incremental_index_equals_rebuilt() -> None:
    rng = random.Random(0)
    seq = [rng.randrange(6) for _ in range(300)]
    inc = NgramIndex(1, 5, keep=3)
    for end in range(0, 301, 7):
        inc.extend(seq[:end])
    inc.extend(seq)
    full = NgramIndex(1, 5, keep=3)
    full.extend(seq)
    assert inc.table == full.table and inc.tokens == seq


def _full_search(index: NgramIndex) -> int:
    """The longest match without the incremental bound: every window from the longest."""
    own = index.tokens
    for n in range(min(index.max_n, len(own)), index.min_n - 1, -1):
        if index.table.get(tuple(own[len(own) - n :])):
            return n
    return 0


def test_incremental_lookup_is_the_full_search() -> None:
    """The lookup starts below `max_n` (the match grows by at most one per token): same
    matches and candidates as a search from the longest window, at any step sizes, with
    min_n > 1, across a rewritten tail, and from a prompt and output given in two parts."""
    rng = random.Random(1)
    for min_n, max_n in ((1, 6), (2, 5), (3, 3)):
        seq = [rng.randrange(4) for _ in range(400)]
        inc = NgramIndex(min_n, max_n, keep=3)
        end = 0
        while end < len(seq):
            end += rng.choice((1, 1, 1, 2, 5))
            if rng.random() < 0.05:  # a jump-forward rewrote the last tokens
                seq[end - 2 : end] = [rng.randrange(4) for _ in range(2)]
            cut = rng.randrange(end + 1)
            inc.extend(seq[:cut], seq[cut:end])
            assert inc.tokens == seq[:end]
            full = NgramIndex(min_n, max_n, keep=3)
            full.extend(seq[:end])
            want = _full_search(full)
            if rng.random() < 0.5:
                assert inc.longest_match() == want
            assert inc.candidates(3, 4) == full.candidates(3, 4)
            assert inc.matched == full.matched


def test_longest_window_then_most_recent() -> None:
    index = NgramIndex(1, 4, keep=4)
    #          0  1  2  3  4  5  6  7  8  9 10 11
    index.extend([5, 1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3])
    # suffix windows 4 and 3 never occurred before; (2, 3) was followed by 9 (at 4) and by 8
    # (at 8): the most recent first; the 1-gram (3,) adds no new start
    assert index.candidates(4, 3) == [[8, 7, 2], [9, 1, 2]]
    index.extend([5, 1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3, 8])
    # suffix (7, 2, 3, 8) is new; (2, 3, 8) occurred once, followed by 7, 2
    assert index.candidates(1, 2) == [[7, 2]]


def test_merge_is_a_trie_within_budget() -> None:
    tokens, parents = merge_candidates([[1, 2, 3, 4, 5], [1, 2, 9], [7]], budget=5)
    check_parents_list = [-1, *parents[1:]]
    assert len(tokens) <= 6 and parents[0] == -1
    assert all(0 <= p < j for j, p in enumerate(check_parents_list) if j)
    # the shared prefix 1, 2 is one branch; 9 and 7 each got a node
    assert tokens.count(1) == 1 and 9 in tokens and 7 in tokens
    assert merge_candidates([[4, 4, 4]], budget=8) == ([-1, 4, 4, 4], [-1, 0, 1, 2])
    # chain first (CPU, cost-aware gate): the first candidate takes the budget, then the others
    chain = merge_candidates([[1, 2, 3, 4, 5], [1, 2, 9], [7]], budget=5, reserve_alternates=False)
    assert chain == ([-1, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 3, 4])
    assert merge_candidates([], budget=8) == ([-1], [-1])


def test_rewritten_tail_rebuilds() -> None:
    index = NgramIndex(1, 3, keep=2)
    index.extend([1, 2, 3, 4, 1, 2])
    index.extend([1, 2, 3, 4, 1, 9, 9])  # the tail changed (jump-forward re-tokenized)
    fresh = NgramIndex(1, 3, keep=2)
    fresh.extend([1, 2, 3, 4, 1, 9, 9])
    assert index.table == fresh.table


def _req(rid: str, ids: list[int]) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, origin_input_ids=ids[:2], output_ids=ids[2:],
                           last_token=ids[-1])  # fmt: skip


def test_proposer_shapes_and_release() -> None:
    prop = NgramProposer(num_nodes=6, min_window=1, max_window=4, breadth=2)
    reqs = [_req("a", [1, 2, 3, 1, 2]), _req("b", [7, 8, 9])]
    tree = prop.propose(reqs)
    assert tree.kind is DraftKind.DETERMINISTIC and tree.tokens.shape == (2, 6)
    check_parents(tree.parents)
    assert tree.tokens[0, :3].tolist() == [2, 3, 1]  # (1, 2) was followed by 3, 1, 2
    assert tree.parents[1].tolist() == [-1] * 6  # nothing repeats: the root alone
    assert prop.hints == [2, 0]  # the matched windows: (1, 2), none
    prop.release(reqs[0])
    assert set(prop.indexes) == {"b"}


def test_flags_and_defaults() -> None:
    prop = make_proposer(ServerArgs(speculative_algorithm="NGRAM"), None)
    assert isinstance(prop, NgramProposer)
    assert (prop.num_nodes, prop.min_window, prop.max_window, prop.breadth) == (12, 1, 12, 10)
    prop = make_proposer(
        ServerArgs(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4,
                   speculative_eagle_topk=1, speculative_ngram_max_match_window_size=3),
        None,
    )  # fmt: skip
    assert (prop.num_nodes, prop.max_window, prop.breadth) == (4, 3, 1)
    assert make_proposer(ServerArgs(), None) is None
    with pytest.raises(InvalidRequestError, match="'x' does not exist") as err:
        make_proposer(
            ServerArgs(speculative_algorithm="EAGLE3", speculative_draft_model_path="x"), None
        )
    assert err.value.field == "speculative_draft_model_path"
    with pytest.raises(InvalidRequestError, match="speculative_num_draft_tokens"):
        make_proposer(
            ServerArgs(speculative_algorithm="NGRAM", speculative_num_draft_tokens=65), None
        )


class _EvenGrammar:
    """Accepts even tokens only; records its state to prove it ends where it started."""

    max_rollback = 8

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def accept(self, t: int) -> bool:
        if t % 2:
            return False
        self.tokens.append(t)
        return True

    def rollback(self, n: int) -> None:
        del self.tokens[len(self.tokens) - n :]

    def fill_mask(self, row) -> None:
        row.fill_(len(self.tokens))


def test_check_draft_cuts_by_depth_and_grammar() -> None:
    import torch

    #        0
    #      1(2)   2(3)x        3 is odd: cut with its child 5
    #    3(4)  4(6)   5(8)
    #   6(10)
    tokens = [0, 2, 3, 4, 6, 8, 10]
    parents = [-1, 0, 0, 1, 1, 2, 3]
    g = _EvenGrammar()
    rows = torch.zeros(7, 1, dtype=torch.int32)
    out = check_draft(tokens, parents, max_depth=8, grammar=g, mask_rows=rows)
    assert out.kept == [0, 1, 3, 4, 6] and out.tokens == [0, 2, 4, 6, 10]
    assert out.parents == [-1, 0, 1, 1, 2]
    assert g.tokens == []  # back at the root state
    assert rows[: len(out.kept), 0].tolist() == [0, 1, 2, 2, 3]  # each node's depth state
    shallow = check_draft(tokens, parents, max_depth=1)
    assert shallow.kept == [0, 1, 2]
