"""SGLang 0.5.x endpoint names beyond the core native API (native_api.py), so SGLang's frontend
(`sgl.RuntimeEndpoint`, `sgl.Runtime`) and its `bench_serving` work unchanged:

    GET  /server_info, /model_info       SGLang's current names of /get_server_info, /get_model_info
    POST /concate_and_append_request     SGLang's parallel-encoding join (see below)
    POST /separate_reasoning             `<think>` section / answer of a text (reasoning_parsers.py)
    GET|POST /start_profile, /stop_profile, POST /encode, POST /v1/embeddings
                                         rejected: 400 naming the missing feature

`/concate_and_append_request {"src_rids": [...], "dst_rid": "..."}`: SGLang's interpreter sends it
when a program joins forks with `mode="concate_and_append"` (`global_config.enable_parallel_encoding`
is on by default). By then the client has already appended every fork's text to the joined state,
and each fork committed its text with a 0-token `/generate`, so the fork point and the first fork's
text are in the radix cache. radixlm keeps no KV per request id after a request ends (only the
radix cache, keyed by tokens), so the join is a text concatenation: the joined state's next request
reuses the cached prefix and prefills the rest once, and the model reads the segments with full
attention, exactly as if the concatenated text had been sent. The endpoint validates the ids and
answers 200 (SGLang's own server dropped the endpoint, and its frontend then fails or hangs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from starlette.responses import Response

from radixlm.runtime.server import native_api
from radixlm.runtime.server.errors import ApiError
from radixlm.runtime.server.http_utils import json_response, parse_body
from radixlm.runtime.server.protocol import StrictModel
from radixlm.runtime.server.reasoning_parsers import REASONING_PARSERS

router = APIRouter()


class SeparateReasoningRequest(StrictModel):
    text: str
    reasoning_parser: str | None = None


class ConcateAndAppendRequest(StrictModel):
    src_rids: list[str]
    dst_rid: str


@router.get("/server_info")
async def server_info(request: Request) -> Response:
    return await native_api.get_server_info(request)


@router.get("/model_info")
async def model_info(request: Request) -> Response:
    return await native_api.get_model_info(request)


@router.post("/concate_and_append_request")
async def concate_and_append(request: Request) -> Response:
    body = await parse_body(request, ConcateAndAppendRequest)
    if not body.src_rids:
        raise ApiError(400, "src_rids must name at least one forked state", "src_rids")
    return json_response(
        {"success": True, "mode": "text", "src_rids": body.src_rids, "dst_rid": body.dst_rid}
    )


@router.post("/separate_reasoning")
async def separate_reasoning(request: Request) -> Response:
    """SGLang's `/separate_reasoning`: `{"text", "reasoning_parser"}` (default: the server's
    `--reasoning-parser`) -> `{"text": answer, "reasoning_text": reasoning}`."""
    body = await parse_body(request, SeparateReasoningRequest)
    name = body.reasoning_parser or request.app.state.server.args.reasoning_parser
    if name not in REASONING_PARSERS:
        raise ApiError(
            400,
            f"reasoning_parser must be one of {sorted(REASONING_PARSERS)} (got {name!r})",
            "reasoning_parser",
        )
    reasoning, content = REASONING_PARSERS[name].split(body.text)
    return json_response({"text": content, "reasoning_text": reasoning or ""})


_UNSUPPORTED = {
    "/start_profile": "profiling is not supported by radixlm (use py-spy or torch.profiler "
    "around an Engine)",
    "/stop_profile": "profiling is not supported by radixlm",
    "/encode": "radixlm serves generation models only: /encode (embeddings) is not supported",
    "/v1/embeddings": "radixlm serves generation models only: embeddings are not supported",
}


def _reject(message: str) -> Callable[[Request], Awaitable[Response]]:
    async def handler(request: Request) -> Response:
        raise ApiError(400, message, code="unsupported")

    return handler


for _path, _message in _UNSUPPORTED.items():
    router.add_api_route(_path, _reject(_message), methods=["GET", "POST"])
