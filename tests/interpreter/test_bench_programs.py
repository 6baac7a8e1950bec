"""`radixlm bench programs` machinery on tiny sizes: both workloads on the shared engine (with
and without program-aware caching) and on the transformers baseline."""

from __future__ import annotations

from radixlm.bench import programs as bench
from radixlm.lang.chat_template import from_tokenizer


def test_bench_workloads_on_engine_and_transformers(engine, hf_reference):
    workloads = bench.make_programs(num_shots=1, max_tokens=2)
    backend = bench.CountingEngineBackend(engine)
    rows = [
        bench.run_workload(name, program, backend, mode, 2)
        for name, program in workloads.items()
        for mode in ("radixlm+precache", "radixlm")
    ]
    assert all(r.programs == 2 and r.seconds > 0 for r in rows)
    assert all(r.cache_hit_rate is not None and r.cache_hit_rate > 0 for r in rows)

    hf = bench.TransformersBackend(
        hf_reference.model, hf_reference.tokenizer, from_tokenizer(hf_reference.tokenizer)
    )
    rows.append(bench.run_workload("few_shot", workloads["few_shot"], hf, "transformers", 1))
    table = bench.format_table(rows)
    assert "transformers" in table and "radixlm+precache" in table


def test_bench_arguments():
    args = bench.parse_args(["--workload", "few_shot", "--num-programs", "4"])
    assert (
        args.workload == "few_shot" and args.num_programs == 4 and args.transformers_programs == 8
    )
