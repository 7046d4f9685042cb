"""Prometheus text exposition to flat samples, and the change between two scrapes.

A sample key is the sample name plus its labels other than `engine` and `model_name` (which every vLLM
sample carries), e.g. `vllm:kv_offload_load_bytes_total` or
`vllm:prompt_tokens_by_source_total{source="local_compute"}`. Only what accumulates is kept (counters,
histogram and summary `_sum`/`_count`); buckets, `_created` and gauges are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, float]
IGNORED_LABELS = frozenset({"engine", "model_name"})
ACCUMULATING = frozenset({"counter", "histogram", "summary"})
KEY_FAMILIES = (
    "vllm:kv_offload_load_bytes_total",
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_load_time_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)
"""Always reported, as 0 when a server does not expose them (a control server has no `kv_offload` families)."""


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    kept = sorted((key, value) for key, value in labels.items() if key not in IGNORED_LABELS)
    if not kept:
        return name
    inner = ",".join(f'{key}="{value}"' for key, value in kept)
    return f"{name}{{{inner}}}"


def accumulating_samples(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        if family.type not in ACCUMULATING:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            key = sample_key(sample.name, sample.labels)
            samples[key] = samples.get(key, 0.0) + float(sample.value)
    return samples


def info_labels(text: str, family_name: str) -> dict[str, str]:
    """Labels of an info-style gauge such as `vllm:cache_config_info` (empty when absent)."""
    for family in text_string_to_metric_families(text):
        if family.name == family_name and family.samples:
            return dict(family.samples[0].labels)
    return {}


def delta(before: Samples, after: Samples, always: Iterable[str] = KEY_FAMILIES) -> Samples:
    """after − before for every key that changed, plus `always` (0 when unchanged or absent)."""
    changed = {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}
    return {**dict.fromkeys(always, 0.0), **changed}


def add_into(total: Samples, part: Mapping[str, float]) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value


def pick(samples: Mapping[str, float], prefix: str, **labels: str) -> float:
    """Sum of the samples named `prefix` whose labels include `labels` (label order as in `sample_key`)."""
    total = 0.0
    for key, value in samples.items():
        name, _, rest = key.partition("{")
        if name != prefix:
            continue
        if all(f'{label}="{wanted}"' in rest for label, wanted in labels.items()):
            total += value
    return total
