"""The TP=1 run of the tensor-parallel workload (tp_workload.py), once per session: the oracle of
test_tp_engine.py and test_tp_speculative.py."""

from __future__ import annotations

from typing import Any

import pytest
from distributed.tp_workload import CONFIG, run_workload


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    from radixlm.runtime.frontend.engine import Engine

    engine = Engine(**CONFIG)
    try:
        return run_workload(engine)
    finally:
        engine.shutdown()
