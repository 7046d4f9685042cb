"""`kvgate sim`: a simulated vLLM server for tests, the demo and benchmarks.

It imitates one vLLM OpenAI-compatible server as captured in `tests/fixtures/vllm-0.25.0/` (formats, errors,
metrics, KV events), with the vLLM 0.33 rules for `max_load_tokens` / `max_offload_tokens` (or, with
`--ignore-max-load-tokens`, 0.25.0's, which never reads `max_load_tokens`) and the 0.32+
`vllm:prompt_tokens_cached_by_source_total` family. Modules, one concern each:

- `tokenizer`: byte-level tokenizer and chat template; `hashing`: salted block-hash chains;
  `generation`: the generated text (deterministic for temperature 0 or a seed);
- `gpu_cache`: the GPU prefix cache; `offload`: the CPU tier; `engine`: scheduling and the TTFT model;
- `protocol`: request validation; `errors`: vLLM error bodies; `formats`, `responses_api`: bodies and SSE;
  `generate`: one generation request's life;
- `metrics`: Prometheus families; `kv_events`, `publisher`: KV events over ZMQ; `recorder`: /sim/requests;
- `directives`: fault injection; `auth`: vLLM's API-key check; `asgi`: raw-ASGI plumbing; `routes`, `app`:
  HTTP; `state`: what one app instance owns; `config`, `cli`: settings, flags and uvicorn.

Not simulated: n > 1, several prompts per request, stop strings, logprobs, tools, multimodal input, LoRA,
preemption or waiting for KV space, and vLLM's `http_*` instrumentator metrics. `/sleep` and `/wake_up`
only flip the sleep-state gauge; `/collective_rpc` answers `{"results": []}`.

Test seams (not part of vLLM; unauthenticated like every path outside /v1, /v2, /inference):

- `GET /sim/requests` -> `{"requests": [...]}`: the recent requests this server received, oldest first
  (see `recorder`); `DELETE /sim/requests` forgets them.
- `GET /sim/state` -> GPU cache (blocks, cached, in use), CPU tier (chunks), waiting/running requests,
  sleep level, number of `/reset_prefix_cache` calls, and KV-event batches (`batches_total` = batches
  handed to the publisher so far: every batch of a request that has been answered has a seq below it).
- `GET /kv_event_sources` (as vLLM): the KV-event endpoints.
- Fault directives inside the prompt text or the last user message: `[[sim:status=500]]`,
  `[[sim:drop-after=N]]`, `[[sim:error-after=N]]`, `[[sim:hang]]`, `[[sim:delay-ms=N]]`,
  `[[sim:fail-load]]` (see `directives`); `--fail-loads RATE` and `--load-failure-policy` (see `engine`).
- A client that disconnects stops its request's generation; the record's outcome becomes `aborted`.
"""
