"""The routes besides generation: probes, models, tokenizer, embeddings, metrics, vLLM's operational
(dangerous) routes, and the simulator's own `/sim/...` test seams.
"""

from __future__ import annotations

import base64
import hashlib
import random
import secrets
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.sim import tokenizer
from gateway.sim.asgi import HttpRequest, Send, send_bytes, send_json
from gateway.sim.engine import Engine
from gateway.sim.errors import SimError, bad_request, validation_error
from gateway.sim.generate import base_request_id, require_json, serve_generation
from gateway.sim.protocol import Kind, chat_messages, check_model, decode_json, validate_body
from gateway.sim.recorder import RequestRecord
from gateway.sim.state import SimState

Reply = tuple[int, Any]
"""A status and a JSON payload (None: an empty body without content type)."""
SimpleHandler = Callable[[SimState, HttpRequest, RequestRecord], Awaitable[Reply]]
Handler = Callable[[SimState, HttpRequest, Send, RequestRecord], Awaitable[None]]
EMBEDDING_DIMENSIONS = 32


def simple(handler: SimpleHandler) -> Handler:
    """Adapt a handler that returns (status, payload) to a full route handler that also records."""

    async def route(state: SimState, request: HttpRequest, send: Send, record: RequestRecord) -> None:
        try:
            status, payload = await handler(state, request, record)
        except SimError as error:
            status, payload = error.status, error.body
        if payload is None:
            await send_bytes(send, status, b"", None)
        else:
            await send_json(send, status, payload)
        record.finish(status)

    return route


async def json_body(request: HttpRequest, record: RequestRecord) -> dict[str, Any]:
    require_json(request)
    body = decode_json(await request.body())
    record.note_body(body)
    return body


async def empty_ok(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    return 200, None


async def version(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    return 200, {"version": state.config.vllm_version}


async def load(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    return 200, {"server_load": state.in_flight}


async def models(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    created = state.started_at
    permission = {"id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission", "created": created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                  "organization": "*", "group": None, "is_blocking": False}
    card = {"id": state.config.model, "object": "model", "created": created, "owned_by": "vllm",
            "root": state.config.model, "parent": None, "max_model_len": state.config.max_model_len,
            "permission": [permission]}
    return 200, {"object": "list", "data": [card]}


async def tokenize(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    body = await json_body(request, record)
    check_model(body, state.config.model)
    if "messages" in body:
        add_prompt = body.get("add_generation_prompt", True) is not False
        tokens = tokenizer.apply_chat_template(chat_messages(body["messages"]), add_prompt)
    elif isinstance(body.get("prompt"), str):
        tokens = tokenizer.encode(body["prompt"])
    else:
        raise validation_error(("body", "prompt"), "missing", "Field required")
    return 200, {"count": len(tokens), "max_model_len": state.config.max_model_len, "tokens": tokens,
                 "token_strs": None}


async def detokenize(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    body = await json_body(request, record)
    check_model(body, state.config.model)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise validation_error(("body", "tokens"), "list_type", "Input should be a valid list of integers")
    oov = tokenizer.first_out_of_vocab(tokens)
    if oov is not None:
        raise bad_request(f"Token id {oov} is out of vocabulary")
    return 200, {"prompt": tokenizer.decode(tokens)}


def embedding_inputs(value: object) -> list[list[int]]:
    """`input` as token lists: a string, a list of strings, a token list, or a list of token lists."""
    items = value if isinstance(value, list) and value and not isinstance(value[0], int) else [value]
    out: list[list[int]] = []
    for item in items:
        if isinstance(item, str) and item:
            out.append(tokenizer.encode(item))
        elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            out.append(list(item))
        else:
            raise validation_error(("body", "input"), "value_error", "Input should be text or token ids")
    return out


def embed(tokens: list[int]) -> list[float]:
    """A unit vector that is a function of the tokens (float32 values, so both encodings agree)."""
    seed = int.from_bytes(hashlib.sha256(struct.pack(f"<{len(tokens)}I", *tokens)).digest()[:8], "big")
    rng = random.Random(seed)
    vector = [rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIMENSIONS)]
    norm = sum(x * x for x in vector) ** 0.5 or 1.0
    packed = struct.pack(f"<{len(vector)}f", *(x / norm for x in vector))
    return list(struct.unpack(f"<{len(vector)}f", packed))


def _encoded(vector: list[float], encoding: object) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


async def embeddings(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    body = await json_body(request, record)
    validate_body(body, state.config.model)
    inputs = embedding_inputs(body.get("input"))
    encoding = body.get("encoding_format")
    data = [{"index": i, "object": "embedding", "embedding": _encoded(embed(tokens), encoding)}
            for i, tokens in enumerate(inputs)]
    total = sum(len(tokens) for tokens in inputs)
    usage = {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0, "prompt_tokens_details": None}
    return 200, {"id": f"embd-{base_request_id(request)}", "object": "list", "created": state.started_at,
                 "model": state.config.model, "data": data, "usage": usage}


async def reset_prefix_cache(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    state.reset_calls += 1
    return 200, {"success": state.engine.reset_prefix_cache(request.query_flag("reset_external"))}


async def sleep(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    level = request.query.get("level", ["1"])[-1]
    state.sleep_level = 2 if level == "2" else 1
    state.metrics.set_sleep(state.sleep_level)
    return 200, None


async def wake_up(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    state.sleep_level = 0
    state.metrics.set_sleep(0)
    return 200, None


async def is_sleeping(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    return 200, {"is_sleeping": state.sleep_level > 0}


async def collective_rpc(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    await request.body()
    return 200, {"results": []}


async def sim_requests(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    return 200, {"requests": state.recorder.snapshot()}


async def sim_requests_clear(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    state.recorder.clear()
    return 200, {"cleared": True}


def _lmcache_state(engine: Engine) -> dict[str, int] | None:
    tier = engine.lmcache
    if tier is None:
        return None
    return {"stored_chunks": len(tier), "hit_tokens_total": tier.hit_tokens_total,
            "stored_tokens_total": tier.stored_tokens_total}


async def sim_state(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    engine = state.engine
    cache = engine.cache
    cpu = None if engine.offload is None else {"num_chunks": engine.offload.tier.capacity,
                                                "stored_chunks": len(engine.offload.tier)}
    return 200, {
        "model": state.config.model,
        "gpu": {"num_blocks": cache.num_blocks, "cached_blocks": cache.cached_blocks,
                "blocks_in_use": cache.blocks_in_use, "usage": cache.usage},
        "cpu": cpu, "lmcache": _lmcache_state(engine),
        "waiting": engine.waiting, "running": engine.running, "in_flight": state.in_flight,
        "sleep_level": state.sleep_level, "reset_prefix_cache_calls": state.reset_calls,
        "load_failures": engine.load_failures, "load_failure_policy": state.config.load_failure_policy,
        "kv_events": None if state.publisher is None else {
            "batches_total": state.publisher.enqueued, "batches_sent": state.publisher.next_seq,
            "batches_dropped": state.publisher.dropped},
    }


async def sim_kv_truth(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    """Test seam: per cache salt and medium, the blocks this server announced stored, removed, still held."""
    if state.publisher is None:
        return 404, {"error": "KV events are disabled"}
    return 200, state.publisher.truth.view()


async def server_info(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    """vLLM's dev-mode `GET /server_info` (VLLM_SERVER_DEV_MODE=1), reduced to the parts a gateway reads; the
    real one dumps the whole engine config. Without dev mode the route does not exist (404)."""
    config = state.config
    if not config.server_dev_mode:
        raise SimError(404, "Not Found", "Not Found")
    transfer = None
    if config.offload:
        transfer = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                    "kv_load_failure_policy": config.load_failure_policy,
                    "kv_connector_extra_config": {"block_size": config.offload_block_size,
                                                  "cpu_bytes_to_use": config.cpu_bytes_to_use}}
    return 200, {"vllm_config": {"model_config": {"served_model_name": config.model},
                                 "cache_config": {"block_size": config.block_size},
                                 "kv_transfer_config": transfer}}


async def kv_event_sources(state: SimState, request: HttpRequest, record: RequestRecord) -> Reply:
    """vLLM's `{"<dp_rank>": KVEventsConfig}`; a server without events reports them disabled."""
    if state.publisher is None:
        return 200, {"0": {"enable_kv_cache_events": False, "publisher": "null"}}
    return 200, {"0": state.publisher.describe()}


async def metrics(state: SimState, request: HttpRequest, send: Send, record: RequestRecord) -> None:
    body, content_type = state.metrics.render(request.headers.get("accept", ""))
    await send_bytes(send, 200, body, content_type)
    record.finish(200)


def generation(kind: Kind) -> Handler:
    async def route(state: SimState, request: HttpRequest, send: Send, record: RequestRecord) -> None:
        await serve_generation(state, kind, request, send, record)

    return route


async def invocations(state: SimState, request: HttpRequest, send: Send, record: RequestRecord) -> None:
    """SageMaker-style entry point: a chat body (with `messages`) or a completion body, unauthenticated."""
    raw = await request.body()
    kind = Kind.CHAT if b'"messages"' in raw else Kind.COMPLETION
    await serve_generation(state, kind, request.with_body(raw), send, record)


ROUTES: dict[str, dict[str, Handler]] = {
    "/health": {"GET": simple(empty_ok)},
    "/ping": {"GET": simple(empty_ok), "POST": simple(empty_ok)},
    "/version": {"GET": simple(version)},
    "/load": {"GET": simple(load)},
    "/metrics": {"GET": metrics},
    "/v1/models": {"GET": simple(models)},
    "/v1/completions": {"POST": generation(Kind.COMPLETION)},
    "/v1/chat/completions": {"POST": generation(Kind.CHAT)},
    "/v1/responses": {"POST": generation(Kind.RESPONSES)},
    "/v1/embeddings": {"POST": simple(embeddings)},
    "/tokenize": {"POST": simple(tokenize)},
    "/detokenize": {"POST": simple(detokenize)},
    "/invocations": {"POST": invocations},
    "/reset_prefix_cache": {"POST": simple(reset_prefix_cache)},
    "/sleep": {"POST": simple(sleep)},
    "/wake_up": {"POST": simple(wake_up)},
    "/is_sleeping": {"GET": simple(is_sleeping)},
    "/collective_rpc": {"POST": simple(collective_rpc)},
    "/kv_event_sources": {"GET": simple(kv_event_sources)},
    "/server_info": {"GET": simple(server_info)},
    "/sim/requests": {"GET": simple(sim_requests), "DELETE": simple(sim_requests_clear)},
    "/sim/state": {"GET": simple(sim_state)},
    "/sim/kv-truth": {"GET": simple(sim_kv_truth)},
}
