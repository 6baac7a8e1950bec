"""SGLang 0.5.x `/generate` request fields (`io_struct.GenerateReqInput`) beyond the ones
`protocol.GenerateRequest` declares: each is either a hint radixlm accepts and may ignore (it
cannot change the output), or a feature radixlm does not have, accepted only at SGLang's default
and otherwise rejected with a 400 naming the field and saying why.

`split_sglang_fields(body)` runs before pydantic parses the body (GenerateRequest's
`mode="before"` validator): it removes these keys and returns the first non-default one, which
`GenerateRequest.check()` turns into the 400 (raising inside a pydantic validator would lose the
field name). Unknown keys that are not SGLang's stay in the body: pydantic rejects them by name.
"""

from __future__ import annotations

from typing import Any

# Accepted with any value: scheduling, routing, logging and tracing hints.
HINTS = frozenset(
    {
        "http_worker_ipc",  # SGLang's internal routing between its HTTP workers
        "conversation_id",
        "routing_key",
        "routed_dp_rank",  # data-parallel routing: radixlm runs one scheduler
        "disagg_prefill_dp_rank",
        "decode_tp_size",
        "no_logs",
        "custom_labels",
        "external_trace_header",
        "received_time",
        "need_wait_for_mm_inputs",
        "num_items_assigned",
    }
)

_MM = "radixlm serves text-only models"
# name -> (the values that mean "off", why another value is rejected)
DEFAULT_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "return_routed_experts": ((False, None), "returning the routed experts is not supported"),
    "routed_experts_start_len": ((0, None), "returning the routed experts is not supported"),
    "bootstrap_pair_key": ((None,), "prefill/decode disaggregation is not supported"),
    "require_reasoning": ((False, None), "forcing a reasoning section is not supported"),
    "background": ((False, None), "background (fire-and-forget) requests are not supported"),
    "extra_key": ((None,), "cache namespaces (extra_key) are not supported: the prefix cache "
                  "is shared by all requests"),
    "return_bytes": ((False, None), "return_bytes is not supported"),
    "return_entropy": ((False, None), "return_entropy is not supported"),
    "max_dynamic_patch": ((None,), _MM),
    "min_dynamic_patch": ((None,), _MM),
    "image_max_dynamic_patch": ((None,), _MM),
    "video_max_dynamic_patch": ((None,), _MM),
}  # fmt: skip


def split_sglang_fields(body: Any) -> tuple[Any, tuple[str, str] | None]:
    """`(body without the fields above, (name, message) of the first non-default one or None)`."""
    if not isinstance(body, dict):
        return body, None
    rejected: tuple[str, str] | None = None
    out = {}
    for key, value in body.items():
        if key in HINTS:
            continue
        if key in DEFAULT_ONLY:
            defaults, why = DEFAULT_ONLY[key]
            if rejected is None and not any(value is d or value == d for d in defaults):
                rejected = (key, f"{key} is not supported by radixlm: {why}")
            continue
        out[key] = value
    return out, rejected
