"""`radixlm bench gpu --sections spec` (bench/gpu_spec.py) on CPU. The verify batch it times (the
speculative step's tree verify batch, a chain per request) is a correct one (k + 1 rows of one
request at consecutive positions, in its own req_to_token row):
checked on the default model (random tiny weights predict the same tokens whatever the context,
so they cannot tell a wrong batch): its rows' logits are plain decode's, the target's greedy
continuation as drafts is accepted whole, a wrong draft cuts the acceptance where it stands. The
whole section runs and reports its tables on a tiny random-weight preset."""

from __future__ import annotations

import pytest
import torch

from radixlm.bench import gpu, gpu_spec
from radixlm.runtime.models.default_model import default_model_path


@pytest.fixture(scope="module")
def bench():
    return gpu_spec.VerifyBench(
        default_model_path(), max_batch=2, max_k=4, context=24, device="cpu",
        load_format="auto", num_threads=1,
    )  # fmt: skip


@pytest.mark.parametrize("k", [1, 2, 4])
def test_forced_acceptance_commits_every_draft(bench, k):
    assert bench.accepted(2, k) == [k + 1, k + 1]


def test_a_wrong_draft_stops_the_acceptance(bench):
    vocab = bench.runner.config.vocab_size
    drafts = [list(t) for t in bench.tokens]
    drafts[0][3] = (drafts[0][3] + 1) % vocab  # request 0's third draft is wrong
    drafts[1][1] = (drafts[1][1] + 1) % vocab  # request 1's first draft is wrong
    # request 0: drafts 1 and 2 + the bonus token; request 1: only the bonus token
    assert bench.accepted(2, 4, drafts) == [3, 1]


def test_verify_rows_compute_what_plain_decode_does(bench):
    """Row j of request b's verify batch gives the logits of a plain decode step at its position
    (the same KV, the same causal view): up to float rounding between batch shapes."""
    runner = bench.runner
    verify = runner.compute_logits(runner.forward(bench.rows_batch(2, 4, bench.tokens)))
    plain = [
        runner.compute_logits(runner.forward(bench.rows_batch(2, 0, bench.tokens, offset=j)))
        for j in range(5)
    ]
    expected = torch.stack([plain[j][b] for b in range(2) for j in range(5)])
    torch.testing.assert_close(verify, expected, atol=1e-3, rtol=1e-3)
    # the speculative step's own verify forward (the tree-mask batch the bench times)
    tree = runner.compute_logits(runner.forward(bench.verify_batch(2, 4, bench.tokens)))
    torch.testing.assert_close(tree, expected, atol=1e-3, rtol=1e-3)
    assert bench.predict(bench.rows_batch(2, 4, bench.tokens)) == [
        t for b in range(2) for t in bench.tokens[b][1:6]
    ]


def test_section_runs_and_reports(capsys):
    result = gpu_spec.run(
        "tiny-llama", ks=(2, 3), batches=(1, 2), context=16, iters=2, device="cpu",
        num_threads=1,
    )  # fmt: skip
    assert [r["k"] for r in result["batch1"]] == [2, 3]
    assert all(r["accepted"] == r["k"] + 1 for r in result["batch1"])
    assert all(r["mode"] == "eager" for r in result["batch1"])
    assert [(r["k"], r["batch"], r["rows"]) for r in result["sweep"]] == [
        (2, 1, 3), (2, 2, 6), (3, 1, 4), (3, 2, 8),
    ]  # fmt: skip
    for r in result["sweep"]:
        assert r["pays_x"] == pytest.approx((r["k"] + 1) * r["decode_ms"] / r["verify_ms"])
    assert set(result["crossover"]) == {"k2", "k3"}
    assert "eager (no CUDA graphs on cpu)" in result["graphs"]
    out = capsys.readouterr().out
    assert "verify cost at batch 1" in out and "crossover batch size" in out
    assert gpu.SECTIONS["spec"] is gpu.section_spec
