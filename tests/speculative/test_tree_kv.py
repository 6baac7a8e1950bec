"""Draft-tree layout (mask, depths, positions from parents) and the KV bookkeeping after
acceptance, on the real ReqToTokenPool / SlotAllocator: correct tables, no slot leaked."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.runtime.mem.kv_pool import ReqToTokenPool, SlotAllocator
from radixlm.runtime.speculative.tree import (
    alloc_draft_slots,
    build_tree,
    chain_parents,
    check_parents,
    commit_path,
    unpack_mask,
)


def random_parents(rng: random.Random, n: int, size: int) -> list[int]:
    """A random tree of `size` real nodes padded to `n` (parents before children)."""
    return [-1] + [rng.randrange(j) for j in range(1, size)] + [-1] * (n - size)


def ancestors(parents: list[int], j: int) -> set[int]:
    out = {j}
    while j > 0:
        j = parents[j]
        out.add(j)
    return out


def test_hand_made_tree() -> None:
    #      0
    #    1   2
    #   3 4   5
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, -1, -1]])
    tree = build_tree(parents, torch.tensor([10]), check=True)
    assert tree.num_nodes == 8 and tree.mask.shape == (1, 8, 1)
    assert tree.mask.dtype == torch.int32
    assert tree.depths.tolist() == [[0, 1, 1, 2, 2, 2, 0, 0]]
    assert tree.positions.tolist() == [[10, 11, 11, 12, 12, 12, 10, 10]]
    words = tree.mask[0, :, 0].tolist()
    assert words == [0b1, 0b11, 0b101, 0b1011, 0b10011, 0b100101, 0, 0]  # padding rows: empty


@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 64])
def test_random_trees_mask_matches_ancestor_walk(n: int) -> None:
    """Every size up to two words, bit 31 included (the int32 sign bit), several requests with
    different sizes and prefix lengths; padding nodes are nobody's ancestor."""
    rng = random.Random(n)
    sizes = [n, max(1, n // 2), 1, rng.randint(1, n)]
    rows = [random_parents(rng, n, s) for s in sizes]
    prefix = torch.tensor([0, 7, 3, 100])
    tree = build_tree(torch.tensor(rows), prefix, check=True)
    assert tree.mask.shape == (4, n, -(-n // 32))
    bits = unpack_mask(tree.mask, n)
    for i, (par, size) in enumerate(zip(rows, sizes)):
        for j in range(n):
            want = ancestors(par, j) if j < size else set()
            assert set(torch.nonzero(bits[i, j]).flatten().tolist()) == want, (i, j)
            depth = len(want) - 1 if j < size else 0
            assert tree.depths[i, j] == depth
            assert tree.positions[i, j] == prefix[i] + depth


def test_chain_is_lower_triangular() -> None:
    parents = chain_parents([4, 1, 6], 6)
    assert parents[0].tolist() == [-1, 0, 1, 2, -1, -1]
    tree = build_tree(parents, torch.tensor([5, 0, 9]), check=True)
    bits = unpack_mask(tree.mask, 6)
    tri = torch.ones(6, 6, dtype=torch.bool).tril()
    for i, length in enumerate([4, 1, 6]):
        assert torch.equal(bits[i, :length, :length], tri[:length, :length])
        assert not bits[i, length:].any() and not bits[i, :, length:].any()
    assert tree.positions[2].tolist() == list(range(9, 15))


@pytest.mark.parametrize(
    ("parents", "match"),
    [
        ([[-1, 0, 2]], "before its child"),
        ([[-1, 0, -1, 2]], "padding node"),
        ([[-1] * 65], "at most 64"),
    ],
)
def test_invalid_parents_raise(parents: list[list[int]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_parents(torch.tensor(parents))


class _Pools:
    """The real pools plus the slots each live request owns (its committed prefix)."""

    def __init__(self, num_slots: int = 200, rows: int = 4, context: int = 64) -> None:
        self.table = ReqToTokenPool(rows, context, "cpu")
        self.alloc = SlotAllocator(num_slots, torch.device("cpu"))
        self.owned: dict[int, int] = {}  # row -> committed length

    def new_request(self, prompt_len: int) -> int:
        row = self.table.alloc()
        assert row is not None
        slots = self.alloc.alloc(prompt_len)
        self.table.write(row, 0, slots)
        self.owned[row] = prompt_len
        return row

    def check_accounting(self) -> None:
        """free + owned == capacity, and the owned slots are distinct, nonzero, not free."""
        live = torch.cat(
            [self.table.table[r, :n].to(torch.int64) for r, n in self.owned.items()]
            or [torch.zeros(0, dtype=torch.int64)]
        )
        assert self.alloc.available() + live.numel() == self.alloc.capacity
        free = self.alloc.alloc(self.alloc.available())  # drain, then give back
        assert free is not None
        everything = torch.cat([live, free])
        assert (everything > 0).all() and everything.unique().numel() == self.alloc.capacity
        self.alloc.free(free)


def test_commit_paths_over_many_verify_steps_leak_nothing() -> None:
    """Three requests, 12 verify steps of random trees and random accepted paths: after each
    step the table holds exactly prefix + path slots in order, and every other slot is free."""
    rng = random.Random(1)
    pools = _Pools()
    n = 8
    rows = [pools.new_request(k) for k in (5, 1, 17)]
    history = {r: pools.table.table[r, : pools.owned[r]].tolist() for r in rows}
    for _ in range(12):
        sizes = [rng.randint(1, n) for _ in rows]
        parents = torch.tensor([random_parents(rng, n, s) for s in sizes])
        draft_loc = alloc_draft_slots(pools.alloc, sizes, n)
        assert draft_loc is not None and (draft_loc[:, 0] > 0).all()
        assert ((draft_loc > 0).sum(1) == torch.tensor(sizes)).all()
        for i, row in enumerate(rows):
            par = parents[i].tolist()
            leaf = rng.randrange(sizes[i])
            path = sorted(ancestors(par, leaf))  # parents precede children: sorted = root path
            res = commit_path(
                pools.table, row, pools.owned[row], draft_loc[i], par, path, pools.alloc
            )
            assert res.accepted.tolist() == draft_loc[i, path].tolist()
            assert sorted(res.rejected.tolist() + res.accepted.tolist()) == sorted(
                draft_loc[i][draft_loc[i] > 0].tolist()
            )
            history[row] += res.accepted.tolist()
            pools.owned[row] = res.prefix_len
            assert pools.table.table[row, : res.prefix_len].tolist() == history[row]
        pools.check_accounting()
    for row in rows:  # the requests finish: everything goes back
        pools.alloc.free(pools.table.table[row, : pools.owned.pop(row)].to(torch.int64))
        pools.table.free(row)
    pools.check_accounting()
    assert pools.alloc.available() == pools.alloc.capacity


def test_bad_path_changes_nothing() -> None:
    pools = _Pools()
    row = pools.new_request(3)
    parents = [-1, 0, 0, 1]
    draft_loc = alloc_draft_slots(pools.alloc, [4], 4)
    assert draft_loc is not None
    before = pools.table.table.clone()
    free_before = pools.alloc.available()
    for path in ([], [1], [0, 2, 3], [0, 1, 3, 7]):
        with pytest.raises(ValueError, match="path"):
            commit_path(pools.table, row, 3, draft_loc[0], parents, path, pools.alloc)
    with pytest.raises(ValueError, match="exceeds the context"):
        commit_path(pools.table, row, 62, draft_loc[0], parents, [0, 1, 3], pools.alloc)
    assert torch.equal(pools.table.table, before) and pools.alloc.available() == free_before
    res = commit_path(pools.table, row, 3, draft_loc[0], parents, [0, 1, 3], pools.alloc)
    assert res.rejected.tolist() == [int(draft_loc[0, 2])] and res.prefix_len == 6


def test_alloc_draft_slots_reports_a_full_pool() -> None:
    alloc = SlotAllocator(5, torch.device("cpu"))
    assert alloc_draft_slots(alloc, [3, 3], 4) is None
    assert alloc.available() == 5
    loc = alloc_draft_slots(alloc, [3, 2], 4)
    assert loc is not None and loc.tolist()[0][3] == 0 and loc.tolist()[1][2:] == [0, 0]
    with pytest.raises(ValueError, match=r"1\.\.4 nodes"):
        alloc_draft_slots(alloc, [0], 4)
