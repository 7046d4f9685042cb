"""What offload admission would have changed on the recorded traffic: the trace replayed twice through the same
two-tier model, once with every request storing what its caps allow (admission off) and once with the requests the
doorkeeper would have called new storing nothing (`max_offload_tokens: 0`), as `offload.admission: returning` sends.

The doorkeeper is the live one (`gateway.reuse.admission.simulate_admission`), keyed here on the trace's own
fingerprints: the fingerprint covering the same leading span of tokens the live gateway keys on (`prefix_chunks`
offload chunks). A recorded `max_offload_tokens: 0` is read as admission's own, so "admission off" lets those
requests store; a tenant whose policy sets `max_offload_tokens: 0` stores nothing either way and is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from gateway.plan.replay import CacheShape, replay, shares_at
from gateway.reuse.admission import CHUNK_TOKENS, AdmissionEvent, AdmissionRule, simulate_admission
from gateway.reuse.record import TraceRecord

DEFAULT_RULE = AdmissionRule(mode="returning")


def admission_effect(
    sample: Sequence[TraceRecord], shape: CacheShape, cpu_chunks: int, honour_max_load: bool,
    rule: AdmissionRule = DEFAULT_RULE,
) -> dict[str, Any]:
    """CPU-tier share, chunks stored and requests admitted, without and with admission, at one tier size."""
    considered = [record for record in sample if not _stores_nothing_by_policy(record, sample)]
    without = [msgspec.structs.replace(r, max_offload_tokens=None) if r.max_offload_tokens == 0 else r
               for r in considered]
    decisions = simulate_admission([_event(record, rule) for record in without], rule)
    with_admission = [msgspec.structs.replace(record, max_offload_tokens=0)
                      if decision is not None and not decision.admitted else record
                      for record, decision in zip(without, decisions, strict=True)]
    arms = {name: _arm(records, shape, cpu_chunks, honour_max_load)
            for name, records in (("without", without), ("with", with_admission))}
    refused = sum(1 for decision in decisions if decision is not None and not decision.admitted)
    return {"rule": {"mode": rule.mode, "window_s": rule.window_s, "min_seen": rule.min_seen,
                     "prefix_chunks": rule.prefix_chunks},
            "requests": len(considered), "requests_storing_nothing_with_admission": refused,
            "left_out_requests": len(sample) - len(considered), "cpu_chunks_sampled": cpu_chunks, **arms}


def _arm(records: Sequence[TraceRecord], shape: CacheShape, cpu_chunks: int, honour: bool) -> dict[str, Any]:
    shares = shares_at(replay(records, shape, honour), cpu_chunks)
    stored = sum(_stored_chunks(record, shape) for record in records)
    return {"cpu_share": shares.cpu_share, "gpu_share": shares.gpu_share, "chunks_stored": stored}


def _stored_chunks(record: TraceRecord, shape: CacheShape) -> int:
    per_chunk = max(1, round(shape.offload_block_tokens / record.tokens_per_chunk))
    chunks = record.chunks // per_chunk
    if record.max_offload_tokens is None:
        return chunks
    return min(chunks, int(record.max_offload_tokens // (per_chunk * record.tokens_per_chunk)))


def _event(record: TraceRecord, rule: AdmissionRule) -> AdmissionEvent:
    # The live key covers `prefix_chunks` offload chunks of CHUNK_TOKENS tokens; pick the trace fingerprint that
    # ends at the same token, so the replay keys on the same leading span.
    wanted = max(1, round(rule.prefix_chunks * CHUNK_TOKENS / record.tokens_per_chunk))
    chain = record.fingerprint_list()
    key = [chain[min(wanted, len(chain)) - 1]] if chain else []  # one fingerprint: the doorkeeper keys on it
    return AdmissionEvent(at=record.ts, tenant=record.tenant, fingerprints=key)


def _stores_nothing_by_policy(record: TraceRecord, sample: Sequence[TraceRecord]) -> bool:
    """A tenant whose every recorded request was capped at 0: its policy, not admission, keeps it out."""
    return record.max_offload_tokens == 0 and all(
        other.max_offload_tokens == 0 for other in sample if other.tenant == record.tenant)
