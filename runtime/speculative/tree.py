"""Draft trees in the verify step: their layout (mask, depths, rotary positions) and the KV
bookkeeping after acceptance.

Layout (static shapes, so a verify step can be captured in a CUDA graph): a verify batch holds B
requests x N nodes, N the fixed largest tree (<= `MAX_TREE_NODES`); row r = i * N + j of the
flattened token dim is node j of request i.
    parents [B, N] int: node 0 is the root, the request's last committed token (sampled, its KV not
        in the pool yet; `parents[i, 0]` is ignored). A real node j > 0 has 0 <= parents[i, j] < j
        (topological order, parents first) and a real parent; parents[i, j] < 0 for j > 0 marks a
        padding node: nobody attends to it and its row attends to the prefix only. A chain (NGRAM)
        is the tree with parents[i, j] = j - 1 (`chain_parents`).
    prefix_lens [B] int: tokens of request i whose KV is in the pool, `req_to_token[row, :prefix]`.
    draft_loc [B, N] int64: the KV slots the verify forward stores node j's K/V at (its
        `out_cache_loc`, flattened); slot 0 (the pool's padding slot) for padding nodes.

`build_tree(parents, prefix_lens)` -> `TreeLayout`, on the device of `parents`, with no host sync
(the loops run over log2(N), a python int):
    mask [B, N, W] int32, W = ceil(N / 32): bit t % 32 of word t // 32 of row (i, j) is set iff
        node t is node j itself or one of its ancestors (the tree part of row (i, j)'s attention:
        it also sees the whole prefix). A padding node's row is 0.
    depths [B, N] int64: 0 for the root (and padding nodes);
    positions [B, N] int64 = prefix_lens + depths: the rotary positions (the root at prefix_len).

After verification the request keeps one root-to-node path (the root always; the bonus token
sampled after the path's last node becomes the next root, with no KV yet). `commit_path` writes
the path's slots into `req_to_token[row, prefix_len : prefix_len + len(path)]` (the KV stays where
the verify forward stored it: no copy) and returns every other slot of the tree, which the caller
frees at once (`SlotAllocator.free`); `commit_path(..., allocator=...)` frees them itself.

The verify forward (`verify_forward_batch`) is an EXTEND `ForwardBatch` of the B x N rows with
`tree_mask` set: every node stores its K/V at `draft_loc` (`out_cache_loc`), at its rotary
position, and the attention backends' `forward_verify` applies the mask (runtime/attention/base.py).
Its extend fields say "N new tokens after prefix_len" so that, without `tree_mask`, the same
batch is the causal extend of a chain (the tests compare the two).

Ownership: the scheduler owns `req_to_token` and the allocator (runtime/mem/kv_pool.py); these
helpers only write the rows/slots they are given, from the scheduler thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from radixlm.kernels.verify_attention import MAX_TREE_NODES
from radixlm.kernels.verify_attention_ref import unpack_tree_mask
from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.runtime.mem.kv_pool import ReqToTokenPool, SlotAllocator

unpack_mask = unpack_tree_mask  # [B, N, W] int32 -> [B, N, N] bool


class TreeLayout(NamedTuple):
    mask: torch.Tensor  # [B, N, ceil(N / 32)] int32 packed ancestor-or-self bits
    depths: torch.Tensor  # [B, N] int64
    positions: torch.Tensor  # [B, N] int64 = prefix_lens + depths

    @property
    def num_nodes(self) -> int:
        return int(self.mask.shape[1])


class CommitResult(NamedTuple):
    accepted: torch.Tensor  # [k] int64 slots now at req_to_token[row, prefix_len : prefix_len + k]
    rejected: torch.Tensor  # int64 slots of the tree's other nodes: free them
    prefix_len: int  # the committed length after the commit (prefix_len + k)


def mask_words(num_nodes: int) -> int:
    """int32 words per row of a packed tree mask."""
    return -(-num_nodes // 32)


def chain_parents(lengths: Sequence[int], num_nodes: int, device=None) -> torch.Tensor:
    """Parents [B, N] of chains: request i has lengths[i] nodes (root included), the rest pad."""
    j = torch.arange(num_nodes, device=device)
    n = torch.as_tensor(list(lengths), dtype=torch.int64, device=device)
    return torch.where(j[None, :] < n[:, None], j[None, :] - 1, -1)


def check_parents(parents: torch.Tensor) -> None:
    """Raise ValueError unless `parents` [B, N] is a valid batch of trees (see the module
    docstring). Reads `parents` on the host (one sync)."""
    if parents.dim() != 2 or parents.shape[1] < 1:
        raise ValueError(f"parents must be [B, N] with N >= 1, got {tuple(parents.shape)}")
    if parents.shape[1] > MAX_TREE_NODES:
        raise ValueError(f"a tree has at most {MAX_TREE_NODES} nodes, got {parents.shape[1]}")
    for i, row in enumerate(parents.tolist()):
        for j in range(1, len(row)):
            p = row[j]
            if p >= j:
                raise ValueError(f"parents[{i}, {j}] = {p}: a parent must come before its child")
            if p > 0 and row[p] < 0:
                raise ValueError(f"parents[{i}, {j}] = {p} is a padding node")


def build_tree(parents: torch.Tensor, prefix_lens: torch.Tensor, check: bool = False) -> TreeLayout:
    """The verify step's mask, depths and positions of a batch of trees (module docstring).
    `check`: validate `parents` first (`check_parents`, a host sync)."""
    if check:
        check_parents(parents)
    bsz, n = parents.shape
    device = parents.device
    parents = parents.to(torch.int64)
    real = parents >= 0
    real[:, 0] = True
    # NOTE: pointer doubling over the nodes plus a sentinel node n (no ancestors, its own parent):
    # after s rounds anc[j] holds j's ancestors at distance < 2**s and jump[j] the one at 2**s.
    jump = torch.where(parents >= 0, parents, n)
    jump[:, 0] = n
    jump = torch.cat([jump, torch.full((bsz, 1), n, dtype=torch.int64, device=device)], 1)
    eye = torch.eye(n + 1, n, dtype=torch.bool, device=device)
    anc = eye[None] & torch.cat([real, real.new_zeros(bsz, 1)], 1)[:, :, None]
    for _ in range(max(0, (n - 1).bit_length())):
        anc = anc | anc.gather(1, jump[:, :, None].expand(-1, -1, n))
        jump = jump.gather(1, jump)
    anc = anc[:, :n]  # [B, N, N]: anc[i, j, t] = t is j or an ancestor of j
    depths = (anc.sum(-1) - 1).clamp(min=0)
    words = mask_words(n)
    bits = torch.zeros(bsz, n, words * 32, dtype=torch.int64, device=device)
    bits[:, :, :n] = anc.to(torch.int64)
    shifts = torch.arange(32, dtype=torch.int64, device=device)
    packed = (bits.view(bsz, n, words, 32) << shifts).sum(-1)  # [0, 2**32)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    positions = prefix_lens.to(device=device, dtype=torch.int64)[:, None] + depths
    return TreeLayout(packed, depths, positions)


def verify_forward_batch(
    input_ids: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: Sequence[int],
    draft_loc: torch.Tensor,
    tree: TreeLayout,
) -> ForwardBatch:
    """The verify step's forward batch: `input_ids` [B * N] (node j of request i at row i * N + j;
    any id for padding nodes), `req_pool_indices` [B], `prefix_lens` (host ints, those `tree` was
    built with), `draft_loc` [B, N]. Every row gets logits (`logits_indices` None)."""
    bsz, nodes = draft_loc.shape
    device = input_ids.device
    assert input_ids.shape == (bsz * nodes,) and tree.mask.shape[:2] == (bsz, nodes)
    prefix = list(prefix_lens)
    seq = [p + nodes for p in prefix]
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=device)  # noqa: E731
    return ForwardBatch(
        mode=ForwardMode.EXTEND,
        batch_size=bsz,
        input_ids=input_ids,
        positions=tree.positions.reshape(-1).to(device).contiguous(),
        out_cache_loc=draft_loc.reshape(-1).to(device=device, dtype=torch.int64).contiguous(),
        req_pool_indices=req_pool_indices.to(device=device, dtype=torch.int64),
        seq_lens=t(seq),
        seq_lens_cpu=seq,
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=[nodes] * bsz,
        extend_prefix_lens=t(prefix),
        extend_seq_lens=t([nodes] * bsz),
        extend_start_loc=t([i * nodes for i in range(bsz)]),
        tree_mask=tree.mask.to(device),
    )


def alloc_draft_slots(
    allocator: SlotAllocator, num_nodes: Sequence[int], max_nodes: int
) -> torch.Tensor | None:
    """draft_loc [B, max_nodes] int64: fresh slots for each request's num_nodes[i] real nodes
    (nodes 0..num_nodes[i]-1; the rest slot 0), or None when the pool has too few free slots
    (the caller evicts or retracts, as for decode)."""
    if any(not 1 <= k <= max_nodes for k in num_nodes):
        raise ValueError(f"every tree has 1..{max_nodes} nodes, got {list(num_nodes)}")
    slots = allocator.alloc(sum(num_nodes))
    if slots is None:
        return None
    n = torch.as_tensor(list(num_nodes), dtype=torch.int64, device=slots.device)
    j = torch.arange(max_nodes, device=slots.device)
    used = j[None, :] < n[:, None]
    out = torch.zeros(len(num_nodes), max_nodes, dtype=torch.int64, device=slots.device)
    out[used] = slots  # NOTE: row-major order: request i's slots are contiguous in `slots`
    return out


def commit_path(
    req_to_token: ReqToTokenPool,
    row: int,
    prefix_len: int,
    draft_loc: torch.Tensor,
    parents: Sequence[int] | torch.Tensor,
    path: Sequence[int],
    allocator: SlotAllocator | None = None,
) -> CommitResult:
    """Commit one request's accepted path after a verify step.

    `draft_loc` [N] and `parents` [N]: the request's tree (module docstring); `path`: the
    accepted nodes from the root, `path[0] == 0` and each node the child of the one before.
    Writes their slots at `req_to_token[row, prefix_len : prefix_len + len(path)]` and returns
    them with every other nonzero slot of `draft_loc` (rejected nodes; a padding node's slot too,
    if the caller gave it one), which `allocator` frees at once when given. Raises ValueError
    (changing nothing) for a path that is not a root path of the tree or does not fit the row.
    """
    par = parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)
    nodes = list(path)
    n = len(par)
    if not nodes or nodes[0] != 0:
        raise ValueError(f"an accepted path starts at the root (node 0), got {nodes}")
    for a, b in itertools.pairwise(nodes):
        if not 0 < b < n or par[b] != a:
            raise ValueError(f"accepted path {nodes}: node {b} is not a child of node {a}")
    if prefix_len + len(nodes) > req_to_token.max_context:
        raise ValueError(
            f"accepted path of {len(nodes)} tokens after {prefix_len} exceeds the context "
            f"({req_to_token.max_context})"
        )
    loc = draft_loc.to(torch.int64)
    idx = torch.as_tensor(nodes, dtype=torch.int64, device=loc.device)
    accepted = loc.index_select(0, idx)
    req_to_token.write(row, prefix_len, accepted)
    keep = torch.ones(n, dtype=torch.bool, device=loc.device)
    keep[idx] = False
    rejected = loc[keep & (loc != 0)]
    if allocator is not None:
        allocator.free(rejected)
    return CommitResult(accepted, rejected, prefix_len + len(nodes))
