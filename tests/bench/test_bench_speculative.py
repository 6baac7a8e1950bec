"""`radixlm bench speculative` (bench/speculative.py): its arithmetic (the streamed decode rate,
the acceptance from `meta_info`, a table row) on hand-made inputs, and the whole command on the
tiny random-weight model with the real tokenizer (two real engines, tiny sizes: no numbers)."""

from __future__ import annotations

import json

import pytest

from radixlm.bench import speculative as bench
from radixlm.bench.speculative_workloads import WORKLOADS
from radixlm.runtime.models.default_model import default_model_path


def test_decode_rate_starts_after_the_last_prefill():
    # request 0: first token at t=1, then 2 more by t=3; request 1: first token at t=2 (the
    # window starts there, with 1 + 1 tokens in), 3 more by t=4: 6 tokens in 2 s
    events = [(1.0, 0, 1), (2.0, 1, 1), (2.0, 0, 2), (3.0, 0, 3), (3.0, 1, 2), (4.0, 1, 4)]
    assert bench.decode_rate(events) == pytest.approx((3 + 4 - 2 - 1) / 2.0)
    assert bench.decode_rate([(1.0, 0, 1)]) is None  # one token: no decode window


def test_spec_stats_weights_requests_by_their_verify_steps():
    metas = [
        {"spec_verify_ct": 3, "spec_accept_length": 3.0},
        {"spec_verify_ct": 1, "spec_accept_length": 1.0},
    ]
    assert bench.spec_stats(metas) == (4, pytest.approx(2.5))
    assert bench.spec_stats([{"prompt_tokens": 3}]) == (None, None)  # speculation off
    assert bench.spec_stats([{"spec_verify_ct": 0, "spec_accept_length": 0.0}]) == (0, None)


def test_summarize_medians_speedup_and_acceptance_rate():
    def sample(rate, outputs, accept=None):
        drafted = None if accept is None else int(2 * (accept - 1))
        return bench.Sample(rate, 4, outputs, None if accept is None else 2, accept, drafted)

    off = [sample(10.0, [[1, 2]]), sample(12.0, [[1, 2]]), sample(20.0, [[1, 2]])]
    on = [sample(30.0, [[1, 2]], 3.0), sample(24.0, [[1, 2]], 2.0), sample(18.0, [[1, 2]], 4.0)]
    row = bench.summarize("rewrite", 1, off, on, num_draft_tokens=5)
    assert (row["off_tok_s"], row["on_tok_s"], row["speedup"]) == (12.0, 24.0, 2.0)
    assert row["accept_len"] == 3.0 and row["accept_rate"] == pytest.approx(0.5)  # 2 of 4 drafts
    assert row["drafted"] == 4  # the median of 4, 2, 6
    assert row["identical"] is True
    on[1] = sample(24.0, [[1, 3]], 2.0)  # one repeat's tokens differ from its off twin
    assert bench.summarize("rewrite", 1, off, on, None)["identical"] is False
    row = bench.summarize("chat", 1, off, [sample(11.0, [[1, 2]])], None)  # no speculative keys
    assert row["accept_len"] is None and row["accept_rate"] is None and row["drafted"] is None


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        bench.parse_args(["--workloads", "rewrite,poetry"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])


def test_command_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "spec.json"
    argv = ["--model-path", "tiny-smollm", "--load-format", "dummy",
            "--tokenizer-path", default_model_path(), "--num-threads", "1",
            "--max-new-tokens", "4", "--ignore-eos", "--repeats", "2", "--batch-size", "2",
            "--speculative-num-draft-tokens", "4", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["workload"] for r in rows] == list(WORKLOADS)
    assert result["config"]["speculative_algorithm"] == "NGRAM"
    for row in rows:
        assert row["batch"] == 2 and row["out_tokens"] == 2 * 4
        assert row["off_tok_s"] > 0 and row["on_tok_s"] > 0 and row["speedup"] > 0
        assert row["identical"], row  # greedy speculation is exact
        if row["accept_len"] is not None:  # the engine reports its verify steps
            assert row["verify_steps"] > 0 and 1.0 <= row["accept_len"] <= 4.0
            assert 0.0 <= row["accept_rate"] <= 1.0
            assert row["drafted"] is not None and row["drafted"] >= 0
    table = capsys.readouterr().out
    assert "speedup" in table and "accept_len" in table and "chat" in table
