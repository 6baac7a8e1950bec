"""Every registered architecture's forward against transformers on its tiny model: all-position
logits of one prompt (the torch attention backend, CPU, fp32)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY, save_tiny

from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.models.loader import resolve_model
from radixlm.runtime.server_args import ServerArgs
from tests_helpers import runner_logits

IDS = [1, 5, 17, 250, 3, 99, 42, 7, 7, 7, 128, 64, 11, 2, 3, 255, 0, 9, 31, 200]


@pytest.mark.parametrize("name", list(TINY))
def test_logits_match_transformers(tmp_path, name) -> None:
    hf = save_tiny(name, str(tmp_path))
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    args = ServerArgs(model_path=str(tmp_path), max_total_tokens=256, max_running_requests=2)
    ours = runner_logits(ModelRunner(args, resolve_model(str(tmp_path))), IDS)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
