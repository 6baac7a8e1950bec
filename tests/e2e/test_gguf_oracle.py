"""An oracle that shares nothing with what it checks: transformers loads the default model through
its own GGUF path (`from_pretrained(gguf_file=...)`: its own GGUF reader, de-quantizer, head
reordering, config and tokenizer conversion), and the engine must agree with it on the prompt's
token ids, on the log-probabilities of every prompt and output position, and on greedy tokens.

(The other parity tests use `runtime/models/hf_reference.py`, which builds transformers' model
from the tensors of our own loader: a loader or config bug would sit on both sides there.)
Slow (~25 s to load, mostly transformers parsing the GGUF metadata in Python): one test."""

from __future__ import annotations

import os

import pytest
import torch

from radixlm.runtime.models.default_model import default_model_path
from tests_helpers import PARITY_PROMPTS

MAX_NEW = 16
LOGPROB_TOL = 2e-3


@pytest.fixture(scope="module")
def hf_gguf():
    """(model, tokenizer) loaded by transformers alone from the default model's GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    folder, name = os.path.dirname(path), os.path.basename(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), tokenizer


@pytest.mark.slow
@torch.no_grad()
def test_engine_agrees_with_transformers_own_gguf_loader(fp32_engine, hf_gguf) -> None:
    model, tokenizer = hf_gguf
    for prompt in (PARITY_PROMPTS[3], PARITY_PROMPTS[4]):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = fp32_engine.generate(
            prompt,
            {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True},
            return_logprob=True,
            logprob_start_len=0,
        )
        meta = out["meta_info"]
        assert [t for _, t, _ in meta["input_token_logprobs"]] == ids, prompt
        full = ids + out["output_ids"]
        ref = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), dim=-1)
        # greedy: each output token is transformers' argmax after the same prefix
        assert ref[len(ids) - 1 : -1].argmax(-1).tolist() == out["output_ids"], prompt
        ours = [lp for lp, _, _ in meta["input_token_logprobs"][1:]]
        ours += [lp for lp, _, _ in meta["output_token_logprobs"]]
        theirs = ref[torch.arange(len(full) - 1), torch.tensor(full[1:])]
        diff = (torch.tensor(ours) - theirs).abs().max().item()
        assert diff <= LOGPROB_TOL, (prompt, diff)
