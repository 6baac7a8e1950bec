"""`python -m radixlm.bench.cpu_batch` runs the default model's decode step at 1 and B rows and
prints both times and their throughput ratio."""

from __future__ import annotations

import re

from radixlm.bench import cpu_batch


def test_prints_one_row_and_batch_times(capsys) -> None:
    cpu_batch.main(["--batch", "3", "--steps", "4", "--prompt-len", "8"])
    out = capsys.readouterr().out
    m = re.search(r"1 row ([\d.]+) ms, 3 rows ([\d.]+) ms: 3 streams / 1 stream = ([\d.]+)x", out)
    assert m is not None, out
    one, many, ratio = (float(v) for v in m.groups())
    assert one > 0 and many > 0 and abs(ratio - 3 * one / many) < 0.01
