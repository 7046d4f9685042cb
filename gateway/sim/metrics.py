"""vLLM's Prometheus families, with vLLM's names, labels (`model_name`, `engine="0"`) and buckets.

Each app instance owns its own CollectorRegistry. Counters are declared without `_total`, so the exposition
shows `..._total` and `..._created` like a single-API-server vLLM. With `--offload` the OffloadingConnector
families are added: the `transfer_type` ones are pre-created at 0, the flat ones get samples only after the
first transfer (as in the captures). Not simulated: the `http_*` families of vLLM's HTTP instrumentator,
`vllm:iteration_tokens_total` and the `vllm:estimated_*_per_gpu` model-FLOPs estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from gateway.sim.config import SimConfig

ENGINE_LABELS = ("model_name", "engine")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                         10.0, 20.0, 40.0, 80.0)
OFFLOAD_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
TRANSFER_TYPES = ("GPU_to_CPU", "CPU_to_GPU")


def one_two_five(limit: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 token buckets up to `limit` (e.g. max_model_len)."""
    out: list[float] = []
    exponent = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * exponent
            if value > limit:
                return tuple(out)
            out.append(float(value))
        exponent *= 10


@dataclass(frozen=True)
class PrefillStats:
    """One request's prefill, as the engine saw it."""

    prompt_tokens: int
    gpu_hit_tokens: int
    loaded_tokens: int
    max_tokens: int
    queue_s: float
    prefill_s: float
    ttft_s: float

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.gpu_hit_tokens - self.loaded_tokens


@dataclass(frozen=True)
class FinishStats:
    """One request's end."""

    reason: str
    output_tokens: int
    e2e_s: float
    decode_s: float
    inference_s: float


class SimMetrics:
    """The registry and the families one simulated server exposes."""

    def __init__(self, config: SimConfig) -> None:
        self.registry = CollectorRegistry()
        self._labels = (config.model, "0")
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        self._engine_families(config)
        self._request_families(config)
        self._cache_config(config)
        self.offload = OffloadMetrics(self.registry, self._labels) if config.offload else None

    def render(self, accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, ENGINE_LABELS, registry=self.registry).labels(*self._labels)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, ENGINE_LABELS, registry=self.registry).labels(*self._labels)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        family = Histogram(name, doc, ENGINE_LABELS, registry=self.registry, buckets=buckets)
        return family.labels(*self._labels)

    def _by_label(self, name: str, doc: str, label: str, values: tuple[str, ...]) -> dict[str, Counter]:
        family = Counter(name, doc, (*ENGINE_LABELS, label), registry=self.registry)
        return {value: family.labels(*self._labels, value) for value in values}

    def _engine_families(self, config: SimConfig) -> None:
        self.running = self._gauge("vllm:num_requests_running", "Requests in the simulated batch.")
        self.waiting = self._gauge("vllm:num_requests_waiting", "Requests waiting for the simulated engine.")
        by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Waiting requests by reason.",
                          (*ENGINE_LABELS, "reason"), registry=self.registry)
        self.waiting_capacity = by_reason.labels(*self._labels, "capacity")
        by_reason.labels(*self._labels, "deferred")
        sleep = Gauge("vllm:engine_sleep_state", "Engine sleep state (awake, weights_offloaded, discard_all).",
                      (*ENGINE_LABELS, "sleep_state"), registry=self.registry)
        self.sleep_state = {state: sleep.labels(*self._labels, state) for state in SLEEP_STATES}
        self.sleep_state["awake"].set(1)
        self.kv_usage = self._gauge("vllm:kv_cache_usage_perc", "GPU KV-cache usage, 1 = full.")
        self.queries = self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the GPU cache.")
        self.hits = self._counter("vllm:prefix_cache_hits", "Prompt tokens found in the GPU cache.")
        self.ext_queries = self._counter("vllm:external_prefix_cache_queries", "Tokens asked of the connector.")
        self.ext_hits = self._counter("vllm:external_prefix_cache_hits", "Tokens the connector supplied.")
        self._counter("vllm:mm_cache_queries", "Multi-modal cache queries (always 0 here).")
        self._counter("vllm:mm_cache_hits", "Multi-modal cache hits (always 0 here).")
        self._counter("vllm:num_preemptions", "Preemptions (the simulator never preempts).")

    def _request_families(self, config: SimConfig) -> None:
        tokens = one_two_five(config.max_model_len)
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.by_source = self._by_label("vllm:prompt_tokens_by_source", "Prompt tokens by source.", "source",
                                        PROMPT_SOURCES)
        self.cached = self._counter("vllm:prompt_tokens_cached", "Cached prompt tokens (local + external).")
        self.cached_by_source = self._by_label("vllm:prompt_tokens_cached_by_source",
                                               "Cached prompt tokens by the tier that supplied them.", "source",
                                               CACHED_SOURCES)
        self.generation_tokens = self._counter("vllm:generation_tokens", "Generated tokens.")
        self.success = self._by_label("vllm:request_success", "Finished requests by finish reason.",
                                      "finished_reason", FINISH_REASONS)
        self.request_prompt = self._histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", tokens)
        self.request_generation = self._histogram("vllm:request_generation_tokens", "Generated tokens per request.",
                                                  tokens)
        self.max_generation = self._histogram("vllm:request_max_num_generation_tokens",
                                              "Requested generation tokens per request.", tokens)
        self.params_n = self._histogram("vllm:request_params_n", "The n parameter.", (1.0, 2.0, 5.0, 10.0, 20.0))
        self.params_max_tokens = self._histogram("vllm:request_params_max_tokens", "The max_tokens parameter.",
                                                 tokens)
        self.kv_computed = self._histogram("vllm:request_prefill_kv_computed_tokens",
                                           "Prompt tokens computed (not cached) per request.", tokens)
        self.ttft = self._histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = self._histogram("vllm:inter_token_latency_seconds", "Inter-token latency.",
                                   TOKEN_LATENCY_BUCKETS)
        self.tpot = self._histogram("vllm:request_time_per_output_token_seconds", "Time per output token.",
                                    TOKEN_LATENCY_BUCKETS)
        self.e2e = self._histogram("vllm:e2e_request_latency_seconds", "End-to-end latency.", LATENCY_BUCKETS)
        self.queue = self._histogram("vllm:request_queue_time_seconds", "Time waiting for the engine.",
                                     LATENCY_BUCKETS)
        self.inference = self._histogram("vllm:request_inference_time_seconds", "Time running.", LATENCY_BUCKETS)
        self.prefill = self._histogram("vllm:request_prefill_time_seconds", "Time in prefill.", LATENCY_BUCKETS)
        self.decode = self._histogram("vllm:request_decode_time_seconds", "Time in decode.", LATENCY_BUCKETS)

    def _cache_config(self, config: SimConfig) -> None:
        labels = cache_config_labels(config)
        info = Gauge("vllm:cache_config_info", "The simulated engine's cache configuration.", tuple(labels),
                     registry=self.registry)
        info.labels(**labels).set(1)

    def set_queue(self, waiting: int, running: int) -> None:
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting)
        self.running.set(running)

    def set_sleep(self, level: int) -> None:
        for index, state in enumerate(SLEEP_STATES):
            self.sleep_state[state].set(1 if index == level else 0)

    def observe_prefill(self, stats: PrefillStats, connector: bool) -> None:
        self._count_prompt(stats, connector)
        self.ttft.observe(stats.ttft_s)
        self.queue.observe(stats.queue_s)
        self.prefill.observe(stats.prefill_s)
        self.kv_computed.observe(stats.computed_tokens)
        self.request_prompt.observe(stats.prompt_tokens)
        self.params_n.observe(1)
        self.params_max_tokens.observe(stats.max_tokens)
        self.max_generation.observe(stats.max_tokens)

    def _count_prompt(self, stats: PrefillStats, connector: bool) -> None:
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.queries.inc(stats.prompt_tokens)
        self.hits.inc(stats.gpu_hit_tokens)
        if connector:
            self.ext_queries.inc(stats.prompt_tokens - stats.gpu_hit_tokens)
        self.ext_hits.inc(stats.loaded_tokens)
        self.cached.inc(stats.gpu_hit_tokens + stats.loaded_tokens)
        self.cached_by_source["device"].inc(stats.gpu_hit_tokens)
        self.cached_by_source["host"].inc(stats.loaded_tokens)
        self.by_source["local_compute"].inc(stats.computed_tokens)
        self.by_source["local_cache_hit"].inc(stats.gpu_hit_tokens)
        self.by_source["external_kv_transfer"].inc(stats.loaded_tokens)

    def observe_finish(self, stats: FinishStats) -> None:
        self.success[stats.reason].inc()
        self.generation_tokens.inc(stats.output_tokens)
        self.request_generation.observe(stats.output_tokens)
        self.e2e.observe(stats.e2e_s)
        self.decode.observe(stats.decode_s)
        self.inference.observe(stats.inference_s)
        if stats.output_tokens > 1:
            self.tpot.observe(stats.decode_s / (stats.output_tokens - 1))


class OffloadMetrics:
    """The OffloadingConnector families (vLLM 0.25/0.33 names)."""

    def __init__(self, registry: CollectorRegistry, labels: tuple[str, str]) -> None:
        self._labels = labels
        per_type = (*ENGINE_LABELS, "transfer_type")
        total_bytes = Counter("vllm:kv_offload_total_bytes", "Bytes moved by the KV connector.", per_type,
                              registry=registry)
        total_time = Counter("vllm:kv_offload_total_time", "Seconds spent moving KV data.", per_type,
                             registry=registry)
        size = Histogram("vllm:kv_offload_size", "Bytes per KV transfer.", per_type, registry=registry,
                         buckets=OFFLOAD_SIZE_BUCKETS)
        self._per_type = {t: (total_bytes.labels(*labels, t), total_time.labels(*labels, t),
                              size.labels(*labels, t)) for t in TRANSFER_TYPES}
        self._usage = Gauge("vllm:kv_offload_cpu_cache_usage_perc", "CPU KV space pinned by active transfers.",
                            ENGINE_LABELS, registry=registry)
        self._flat = {
            direction: (
                Counter(f"vllm:kv_offload_{direction}_bytes", f"Bytes of KV {direction}s.", ENGINE_LABELS,
                        registry=registry),
                Counter(f"vllm:kv_offload_{direction}_time", f"Seconds of KV {direction}s.", ENGINE_LABELS,
                        registry=registry),
                Histogram(f"vllm:kv_offload_{direction}_size", f"Bytes per KV {direction}.", ENGINE_LABELS,
                          registry=registry, buckets=OFFLOAD_SIZE_BUCKETS),
            )
            for direction in ("store", "load")
        }

    def observe(self, direction: str, nbytes: int, seconds: float) -> None:
        """One store (GPU to CPU) or load (CPU to GPU) of `nbytes` taking `seconds`."""
        transfer = "GPU_to_CPU" if direction == "store" else "CPU_to_GPU"
        total_bytes, total_time, size = self._per_type[transfer]
        total_bytes.inc(nbytes)
        total_time.inc(seconds)
        size.observe(nbytes)
        flat_bytes, flat_time, flat_size = self._flat[direction]
        flat_bytes.labels(*self._labels).inc(nbytes)
        flat_time.labels(*self._labels).inc(seconds)
        flat_size.labels(*self._labels).observe(nbytes)
        self._usage.labels(*self._labels).set(0.0)


def cache_config_labels(config: SimConfig) -> dict[str, str]:
    """`vllm:cache_config_info` labels: the captured label set, with this simulator's values."""
    tokens = config.gpu_blocks * config.block_size
    return {
        "_block_size_resolved": "True", "block_size": str(config.block_size), "cache_dtype": "auto",
        "calculate_kv_scales": "False", "enable_prefix_caching": "True", "engine": "0",
        "gpu_memory_utilization": "0.9", "hash_block_size": "None", "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]", "kv_cache_max_concurrency": str(tokens / config.max_model_len),
        "kv_cache_memory_bytes": str(tokens * config.kv_bytes_per_token), "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native", "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None",
        "num_gpu_blocks": str(config.gpu_blocks), "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256", "skip_page_size_padded": "None", "sliding_window": "None",
        "user_specified_block_size": "False", "user_specified_mamba_block_size": "False",
    }
