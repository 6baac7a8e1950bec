"""The one result path: a `StepOutput` (step.py) applied to its requests.

`ResultPath.apply(out)`, for the plain loop and the overlapped one alike:
    read the tokens (the step's host sync) -> input logprobs -> per sampled request: grammar
    accept, append the token and its logprobs, stop checks (eos, stop ids, stop strings,
    stop_regex, lengths; req.py `check_finished`) -> jump-forward (constrained requests whose
    grammar forces a string: re-queued with it appended) -> finishing: finished requests hand
    their KV to the prefix cache; an extended request joins `running` (its prompt's KV inserted
    in the cache, so it is shared); every request's due output is queued for the detokenizer.

Ownership: writes the requests' token, logprob and finish state and moves them between the
queues (queues.py); runs on the scheduler's thread.
"""

from __future__ import annotations

from typing import Any

from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.sampling.stop_match import StopChecker
from radixlm.runtime.scheduler.policy import NewTokenRatio
from radixlm.runtime.scheduler.queues import ReqQueues
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.schedule_batch import ScheduleBatch
from radixlm.runtime.scheduler.step import StepOutput, StepTokens


class ResultPath:
    def __init__(
        self,
        queues: ReqQueues,
        grammars: Any,  # constrained/manager.py `GrammarManager`
        stops: StopChecker | None,  # None without a tokenizer
        context_len: int,
        ratio: NewTokenRatio,
        stats: dict[str, Any],
    ) -> None:
        self.queues = queues
        self.grammars = grammars
        self.stops = stops
        self.context_len = context_len
        self.ratio = ratio
        self.stats = stats

    def apply(self, out: StepOutput) -> None:
        batch = out.batch
        host = out.resolve()
        if batch.mode == ForwardMode.DECODE:
            # NOTE: a request finished while its step was in flight (aborted; overlap.py) was
            # already released and reported: it drops its token.
            live = [(k, r) for k, r in enumerate(out.sampled) if not r.finished]
            for k, req in live:
                self.append_token(req, k, host)
            if out.masked and self.grammars.jump_forward_enabled:
                self.jump_forward(out.sampled)
            self.finish_decode([r for _, r in live])
            self.ratio.decay()
            return
        for (i, _, _, _), (values, tops) in zip(batch.lp_rows, out.input_logprobs):
            req = batch.reqs[i]
            req.input_logprobs.extend(values)
            if tops is not None:
                req.input_top.extend(tops)
        for req in batch.reqs:
            if not req.input_logprobs_done and req.computed >= len(req.origin_input_ids):
                req.input_logprobs_done = True
        for k, req in enumerate(out.sampled):
            self.append_token(req, k, host)
        if out.masked and self.grammars.jump_forward_enabled:
            self.jump_forward(out.sampled)
        self.finish_extend(batch)

    def append_token(self, req: Req, k: int, host: StepTokens) -> None:
        if req.finished:  # aborted meanwhile
            return
        if req.sampling_params.max_new_tokens == 0 and not req.output_ids:
            req.finished_reason = {"type": "length", "length": 0}
            return
        token = host.tokens[k]
        if req.grammar is not None and not req.grammar.accept(token):
            # Only reachable when every token was masked out (e.g. by other logit processors).
            req.abort(f"constrained decoding failed: the grammar rejected token {token}")
            return
        req.output_ids.append(token)
        self.stats["generated_tokens"] += 1
        if req.return_logprob and host.logprobs is not None:
            req.output_logprobs.append(host.logprobs[k])
            if req.top_logprobs_num and host.top is not None:
                req.output_top.append(host.top[k][: req.top_logprobs_num])
        req.check_finished(self.stops, self.context_len)

    def jump_forward(self, reqs: list[Req]) -> None:
        """Append the string each request's grammar forces (see constrained/jump_forward.py):
        the KV of the old ids goes to the cache, the new ids are computed by an extend round."""
        for req in reqs:
            new_ids = self.grammars.try_jump(req)
            if new_ids is None:
                continue
            if req in self.queues.running:
                self.queues.running.remove(req)
            # NOTE: requeue caches the KV under the *old* ids before they are replaced.
            self.queues.requeue(req)
            req.output_ids = new_ids

    def finish_extend(self, batch: ScheduleBatch) -> None:
        queues = self.queues
        for req in batch.reqs:
            if req is queues.chunked and not req.finished:
                queues.cache.cache_unfinished_req(req)  # its next chunk goes first next round
                continue
            req.is_chunked = False
            if req.finished:
                queues.release(req)
            elif req.req_pool_idx is None:
                pass  # NOTE: jump-forward already put it back in the queue (without a row)
            else:
                queues.cache.cache_unfinished_req(req)
                queues.running.append(req)
            queues.queue_output(req)

    def finish_decode(self, reqs: list[Req]) -> None:
        queues = self.queues
        for req in reqs:
            if req.finished:
                if req in queues.running:
                    queues.running.remove(req)
                queues.release(req)
            queues.queue_output(req)
