"""What the scheduler sends the detokenizer about a request: the ids, logprobs and finish state
since the last message (`make_output`), or an error for a request that never ran
(`error_output`). Pure functions of the request; they advance its `sent_*` counters."""

from __future__ import annotations

from radixlm.runtime.processes import io
from radixlm.runtime.scheduler.req import Req


def make_output(req: Req) -> io.ReqOut:
    """What is new for `req` since its last message (ids, logprobs, finish state); the first
    message also carries the settings the detokenizer needs (stop strings, special tokens)."""
    new_ids = req.output_ids[req.sent_ids :]
    out = io.ReqOut(
        rid=req.rid,
        new_ids=new_ids,
        finished=req.finished,
        finish_reason=req.finished_reason,
        prompt_tokens=len(req.origin_input_ids),
        completion_tokens=len(req.output_ids),
        cached_tokens=req.cached_tokens,
        spec_verify_ct=req.spec_verify_ct,
        spec_committed=req.spec_committed,
    )
    if req.return_logprob:
        out.output_logprobs = req.output_logprobs[req.sent_ids :]
        if req.top_logprobs_num:
            out.output_top = req.output_top[req.sent_ids :]
        if req.input_logprobs_done and req.sent_input_logprobs == 0 and req.logprob_start_len >= 0:
            out.input_logprobs = req.input_logprobs
            out.input_ids = req.origin_input_ids[req.logprob_start_len :]
            if req.top_logprobs_num:
                out.input_top = req.input_top
            req.sent_input_logprobs = len(req.input_logprobs) or 1
    if not req.first_sent:
        sp = req.sampling_params
        out.stop = sp.stop
        out.skip_special_tokens = sp.skip_special_tokens
        out.spaces_between_special_tokens = sp.spaces_between_special_tokens
        out.no_stop_trim = sp.no_stop_trim
        req.first_sent = True
    req.sent_ids = len(req.output_ids)
    return out


def error_output(rid: str, prompt_tokens: int, message: str, status_code: int) -> io.ReqOut:
    """The final message of a request that holds no KV and ends with an error."""
    return io.ReqOut(
        rid=rid,
        new_ids=[],
        finished=True,
        finish_reason={"type": "abort", "message": message, "status_code": status_code},
        prompt_tokens=prompt_tokens,
        completion_tokens=0,
        cached_tokens=0,
    )
