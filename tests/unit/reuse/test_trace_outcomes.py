"""The reuse trace's request-path decision and its background writer, on a real SQLite trace store: each outcome a
request can be counted under, the bounds on what is queued, the records written (numbers and fingerprints, never
text), per-user keys, erasure on a raised salt epoch, and the fingerprint chain's prefix property."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gateway.policy.loader import PolicySet
from gateway.policy.model import CachePolicy, GatewayConfig, TenantPolicy
from gateway.proxy.rawprompt import decode_request
from gateway.proxy.sse import Usage
from gateway.reuse import fingerprint
from gateway.reuse.fingerprint import (
    FINGERPRINT_BYTES,
    KeptIds,
    PromptParts,
    fingerprints,
    kept_ids,
    tenant_trace_key,
    trace_parts,
)
from gateway.reuse.record import TraceRecord, encode_record
from gateway.reuse.store import SqliteTraceStore
from gateway.reuse.trace import FinishedRequest, ReuseTrace, TraceMetrics, TraceSettings, TransferCaps
from gateway.storage import Storage
from gateway.tasks import TaskSupervisor

SECRET = b"unit-secret-of-at-least-32-bytes!!"
GATEWAY = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p"})
USAGE = Usage(prompt_tokens=48, cached_tokens=16, completion_tokens=5)
IDS = list(range(7, 7 + 48))  # three 16-token blocks


def policy_set(epoch: int = 1) -> PolicySet:
    acme = TenantPolicy(tenant="acme", cache=CachePolicy(salt_epoch=epoch))
    return PolicySet(gateway=GATEWAY, tenants={"acme": acme}, keys={}, version="v")


async def new_trace(tmp_path: Path, **changes: object) -> tuple[ReuseTrace, Storage, CollectorRegistry]:
    storage = await Storage.open(None, tmp_path / "state.sqlite3")
    store = await SqliteTraceStore.open(storage.sqlite_worker())
    registry = CollectorRegistry()
    trace_settings = TraceSettings(**changes)  # type: ignore[arg-type]
    current = policy_set()
    return ReuseTrace(store, SECRET, trace_settings, TraceMetrics(registry), lambda: current), storage, registry


def finished(epoch: int, parts: PromptParts | KeptIds | None, usage: Usage | None, user: str | None = None,
             caps: TransferCaps = (None, None)) -> FinishedRequest:
    return FinishedRequest("acme", epoch, "p", parts, usage, user, caps)


def counted(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value("kvgate_reuse_trace_requests_total", {"tenant": "acme", "outcome": outcome})
    return value or 0.0


@pytest.mark.parametrize(("parts", "usage", "outcome"), [
    (None, USAGE, "no_prompt"),
    (PromptParts([]), USAGE, "no_prompt"),
    (PromptParts(None, ("",)), USAGE, "no_prompt"),
    (PromptParts(IDS), None, "no_usage"),
    (PromptParts(IDS), Usage(prompt_tokens=0), "no_usage"),
    (PromptParts(IDS[:15]), USAGE, "short_prompt"),  # not one whole 16-token block
    (PromptParts(IDS[:16]), USAGE, "sampled"),
    (PromptParts(IDS), USAGE, "sampled"),
    (PromptParts(None, ("x" * 63,)), Usage(prompt_tokens=16), "short_prompt"),  # 4 chars per token: 64 needed
    (PromptParts(None, ("x" * 40, "y" * 24)), Usage(prompt_tokens=16), "sampled"),
])
def test_each_request_is_counted_under_one_outcome(tmp_path: Path, parts: PromptParts | None, usage: Usage | None,
                                                   outcome: str) -> None:
    async def run() -> None:
        trace, storage, registry = await new_trace(tmp_path)
        assert trace.observe(finished(1, parts, usage)) == outcome
        assert counted(registry, outcome) == 1
        await storage.close()

    asyncio.run(run())


@pytest.mark.parametrize("bound", [{"max_pending": 2}, {"max_pending_units": 100}])
def test_a_full_queue_drops_and_counts_instead_of_growing(tmp_path: Path, bound: dict[str, int]) -> None:
    async def run() -> None:
        trace, storage, registry = await new_trace(tmp_path, **bound)
        outcomes = [trace.observe(finished(1, PromptParts(IDS), USAGE)) for _ in range(3)]
        assert outcomes == ["sampled", "sampled", "dropped_queue_full"]
        assert counted(registry, "dropped_queue_full") == 1
        await trace.flush()  # the queue drains, so requests are taken again
        assert trace.observe(finished(1, PromptParts(IDS), USAGE)) == "sampled"
        await storage.close()

    asyncio.run(run())


def test_a_flush_writes_numbers_and_fingerprints_and_never_the_prompt(tmp_path: Path) -> None:
    secret_text = "CONFIDENTIAL-PROMPT " * 10  # 200 characters

    async def run() -> list[TraceRecord]:
        trace, storage, _ = await new_trace(tmp_path)
        trace.observe(finished(1, PromptParts(IDS), USAGE, caps=(512, 0)))
        trace.observe(finished(1, PromptParts(None, (secret_text,)), Usage(prompt_tokens=50)))
        assert await trace.flush() is True
        records = await trace.store.read("acme", None)
        raw = await storage.sqlite_worker().run(lambda db: db.execute("SELECT * FROM reuse_trace").fetchall())
        assert b"CONFIDENTIAL" not in repr(raw).encode() and all(b"CONFIDENTIAL" not in encode_record(r)
                                                                  for r in records)
        await storage.close()
        return records

    ids_record, text_record = sorted(asyncio.run(run()), key=lambda record: record.text)
    assert (ids_record.prompt_tokens, ids_record.cached_tokens, ids_record.completion_tokens) == (48, 16, 5)
    assert (ids_record.text, ids_record.chunk_units, ids_record.tokens_per_chunk) == (False, 16, 16.0)
    assert (ids_record.max_offload_tokens, ids_record.max_load_tokens, ids_record.epoch) == (512, 0, 1)
    assert ids_record.chunks == 3 and len(ids_record.chain) == 3 * FINGERPRINT_BYTES
    # 200 characters for 50 tokens: 4 per token, so 64-character chunks of 16 tokens each, three whole ones
    assert (text_record.text, text_record.chunk_units, text_record.tokens_per_chunk, text_record.chunks) == (
        True, 64, 16.0, 3)


def test_users_of_a_per_user_tenant_get_chains_of_their_own(tmp_path: Path) -> None:
    async def run() -> list[bytes]:
        trace, storage, _ = await new_trace(tmp_path)
        for user in ("alice", "bob", None):
            trace.observe(finished(1, PromptParts(IDS), USAGE, user=user))
        await trace.flush()
        chains = [record.chain for record in await trace.store.read("acme", None)]
        await storage.close()
        return chains

    chains = asyncio.run(run())
    assert len(chains) == 3 and len(set(chains)) == 3
    key = tenant_trace_key(SECRET, "acme")
    assert b"".join(fingerprints(key, IDS, 16, 4.0)) in chains  # the tenant-wide chain is the plain one


def test_a_raised_epoch_erases_what_is_queued_and_stored_below_it(tmp_path: Path) -> None:
    async def run() -> None:
        trace, storage, _ = await new_trace(tmp_path)
        trace.observe(finished(1, PromptParts(IDS), USAGE))
        await trace.flush()
        trace.observe(finished(1, PromptParts(IDS[:32]), USAGE))  # queued, not yet written
        trace.on_policies(policy_set(epoch=2))  # `tenant forget`
        trace.observe(finished(2, PromptParts(IDS[:16]), USAGE))
        await trace.flush()
        records = await trace.store.read("acme", None)
        assert [(record.epoch, record.chunks) for record in records] == [(2, 1)]
        trace.on_policies(policy_set(epoch=2))  # the same epoch again erases nothing
        await trace.flush()
        assert len(await trace.store.read("acme", None)) == 1
        await storage.close()

    asyncio.run(run())


def test_a_request_that_finishes_after_the_erasure_is_not_recorded_under_the_erased_epoch(tmp_path: Path) -> None:
    async def run() -> None:
        trace, storage, registry = await new_trace(tmp_path)
        trace.on_policies(policy_set(epoch=2))  # `tenant forget` reloaded while a request of epoch 1 was running
        assert trace.observe(finished(1, PromptParts(IDS), USAGE)) == "erased_epoch"
        assert counted(registry, "erased_epoch") == 1
        assert trace.observe(finished(2, PromptParts(IDS), USAGE)) == "sampled"
        await trace.flush()
        assert [record.epoch for record in await trace.store.read("acme", None)] == [2]
        await storage.close()

    asyncio.run(run())


LONG_IDS = list(range(3, 3 + 16 * 600))  # 600 whole blocks: more than two slices of the background hashing


def kept_request(text: str) -> dict[str, object]:
    """The request as the gateway's rewrite holds it: a prompt of 64 bytes or more kept as its JSON text."""
    return decode_request(f'{{"model": "m", "prompt": {text}}}'.encode(), raw_from=64)


@pytest.mark.parametrize(("make_parts", "turns"), [
    (lambda: PromptParts(LONG_IDS), 2),  # 600 fingerprints: the loop ran twice before the chain was done
    # A token-id list kept as JSON text: its 600 blocks are decoded and hashed, the loop running in between.
    (lambda: kept_ids(kept_request(json.dumps(LONG_IDS)), 16), 4),
], ids=["decoded", "kept-as-json-text"])
def test_a_long_chain_hashed_in_slices_is_the_chain_hashed_at_once_and_lets_the_loop_run(
        tmp_path: Path, make_parts: Callable[[], PromptParts | KeptIds | None], turns: int) -> None:
    async def run() -> None:
        trace, storage, _ = await new_trace(tmp_path)
        tasks = TaskSupervisor("trace-slices-test")
        assert trace.observe(finished(1, make_parts(), USAGE)) == "sampled"
        hashing = tasks.spawn(trace.hash_pending(), "hash")
        turns_while_hashing = 0
        while not hashing.done():
            await asyncio.sleep(0)  # the only thing this test waits on: a turn of the event loop
            turns_while_hashing += not hashing.done()
        await hashing
        await trace.flush()
        records = await trace.store.read("acme", None)
        assert [record.chain for record in records] == [b"".join(fingerprints(KEY, LONG_IDS, 16, 4.0))]
        assert turns_while_hashing >= turns
        await tasks.close()
        await storage.close()

    asyncio.run(run())


class MidChain(NamedTuple):
    """A trace whose background hashing of one long chain has done its first slice and yielded."""

    trace: ReuseTrace
    storage: Storage
    tasks: TaskSupervisor
    hashing: asyncio.Task[None]


async def mid_chain(tmp_path: Path) -> MidChain:
    trace, storage, _ = await new_trace(tmp_path)
    tasks = TaskSupervisor("trace-mid-chain-test")
    trace.observe(finished(1, PromptParts(LONG_IDS), USAGE))
    hashing = tasks.spawn(trace.hash_pending(), "hash")
    await asyncio.sleep(0)  # the chain's first slice is hashed, the job out of the queue
    assert not hashing.done()
    return MidChain(trace, storage, tasks, hashing)


def test_a_chain_hashed_while_its_epoch_is_erased_is_not_recorded(tmp_path: Path) -> None:
    async def run() -> None:
        trace, storage, tasks, hashing = await mid_chain(tmp_path)
        trace.on_policies(policy_set(epoch=2))  # `tenant forget` comes into force mid-chain
        await hashing
        await trace.flush()
        assert await trace.store.read("acme", None) == []
        await tasks.close()
        await storage.close()

    asyncio.run(run())


def test_a_chain_stopped_mid_way_goes_back_to_the_queue_and_is_written_at_close(tmp_path: Path) -> None:
    async def run() -> None:
        trace, storage, tasks, _ = await mid_chain(tmp_path)
        await tasks.close()  # the writer is cancelled at a yield, as at shutdown
        await trace.close()
        records = await trace.store.read("acme", None)
        assert [record.chain for record in records] == [b"".join(fingerprints(KEY, LONG_IDS, 16, 4.0))]
        await storage.close()

    asyncio.run(run())


KEY = tenant_trace_key(SECRET, "acme")


@settings(max_examples=40, deadline=None)
@given(shared=st.integers(0, 6), tail_a=st.lists(st.integers(0, 50_000), min_size=4, max_size=40),
       tail_b=st.lists(st.integers(0, 50_000), min_size=4, max_size=40))
def test_prompts_share_exactly_the_fingerprints_of_their_shared_whole_blocks(shared: int, tail_a: list[int],
                                                                              tail_b: list[int]) -> None:
    prefix = list(range(shared * 4))
    if tail_a[:4] == tail_b[:4]:
        tail_b = [tail_a[0] + 1, *tail_b[1:]]  # the first block after the prefix differs
    a, b = fingerprints(KEY, prefix + tail_a, 4, 4.0), fingerprints(KEY, prefix + tail_b, 4, 4.0)
    assert a[:shared] == b[:shared]
    assert a[shared] != b[shared]  # and nothing after the first difference matches by chaining
    assert all(len(fingerprint) == FINGERPRINT_BYTES for fingerprint in a)


def test_fingerprints_are_keyed_per_tenant() -> None:
    assert fingerprints(KEY, IDS, 16, 4.0) != fingerprints(tenant_trace_key(SECRET, "beta"), IDS, 16, 4.0)
    assert fingerprints(KEY, IDS, 16, 4.0) != fingerprints(tenant_trace_key(b"another" * 5, "acme"), IDS, 16, 4.0)


SERIALISATIONS = {  # how clients may write the same list
    "compact": lambda ids: json.dumps(ids, separators=(",", ":")),
    "spaced": lambda ids: json.dumps(ids),
    "indented": lambda ids: json.dumps(ids, indent=1),
    "padded": lambda ids: "[ " + " ,\n\t".join(map(str, ids)) + " ]",
    "wide": lambda ids: "[" + ",".join(f"{i}{' ' * 40}" for i in ids) + "]",  # the head shows no whole block
}


async def recorded_chain(tmp_path: Path, parts: PromptParts | KeptIds, count: int) -> bytes:
    trace, storage, _ = await new_trace(tmp_path)
    assert trace.observe(finished(1, parts, Usage(prompt_tokens=count))) == "sampled"
    await trace.flush()
    records = await trace.store.read("acme", None)
    await storage.close()
    return records[0].chain


@settings(max_examples=30, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(0, 200_000), st.integers(-5, 2**40)), min_size=140, max_size=700),
       style=st.sampled_from(sorted(SERIALISATIONS)), piece_bytes=st.sampled_from([8, 64, 300, 16 * 1024]))
def test_a_token_id_list_kept_as_json_text_is_chained_as_the_decoded_list(
        tmp_path_factory: pytest.TempPathFactory, ids: list[int], style: str, piece_bytes: int) -> None:
    """Sampled from its head, decoded in the background a piece at a time (pieces of any size, cut at commas, the
    ids after the last whole block carried over): the same chain as the whole list, in any serialisation."""
    request = kept_request(SERIALISATIONS[style](ids))  # 140 ids: past the 256 bytes of head read for 16 ids
    parts = trace_parts(request, 16)
    assert parts is not None
    assert isinstance(parts, KeptIds) == (style != "wide")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fingerprint, "ID_PIECE_BYTES", piece_bytes)
        chain = asyncio.run(recorded_chain(tmp_path_factory.mktemp("kept"), parts, len(ids)))
    assert chain == b"".join(fingerprints(KEY, ids, 16, 4.0))


def test_a_kept_text_prompt_is_read_whole_as_text() -> None:
    """Only a kept list is read from its head; a kept string is the prompt's text, as canonical_parts reads it."""
    parts = trace_parts(kept_request(json.dumps("a prompt, kept as its JSON text " * 40)), 16)
    assert parts == PromptParts(None, ("a prompt, kept as its JSON text " * 40,))


@pytest.mark.parametrize("text", [
    json.dumps([*range(200), "a,b,c,d,e,f,g,h,i,j,k,l,m,n", 7, *range(20)]),  # a string may hold commas
    json.dumps([*range(200), [1, 2], {"a": 1}, *range(20)]),
])
def test_a_kept_list_that_is_not_numbers_alone_is_decoded_whole(tmp_path: Path, text: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    parts = kept_ids(kept_request(text), 16)
    assert isinstance(parts, KeptIds)
    monkeypatch.setattr(fingerprint, "ID_PIECE_BYTES", 8)  # pieces cut at commas would cut the string in two
    chain = asyncio.run(recorded_chain(tmp_path, parts, 222))
    assert chain == b"".join(fingerprints(KEY, json.loads(text), 16, 4.0))


def test_a_sampled_token_id_list_waits_as_its_json_text_not_as_python_integers(tmp_path: Path) -> None:
    """The request path reads the first block from the head: the list is decoded only in the background, and only
    for a sampled request; the queue counts it by an upper bound on its ids (one per two bytes)."""
    async def run() -> None:
        trace, storage, _ = await new_trace(tmp_path)
        text = json.dumps(LONG_IDS)
        request = kept_request(text)
        assert trace.observe(finished(1, trace_parts(request, 16), USAGE)) == "sampled"
        (job,) = trace._jobs
        assert isinstance(job.prompt, KeptIds) and job.prompt.raw is request["prompt"]
        assert job.length == (len(text) + 1) // 2 >= len(LONG_IDS)
        await storage.close()

    asyncio.run(run())


def test_a_kept_list_with_a_number_no_engine_reads_is_not_recorded(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Its head is sampled; the piece holding a number beyond float range cannot be decoded, and nothing is recorded
    (as when the finish hook decoded the whole list and found no prompt), rather than a chain cut short."""
    monkeypatch.setattr(fingerprint, "ID_PIECE_BYTES", 64)
    text = "[" + ",".join(map(str, LONG_IDS[:200])) + ",1e400]"

    async def run() -> None:
        trace, storage, _ = await new_trace(tmp_path)
        assert trace.observe(finished(1, trace_parts(kept_request(text), 16), USAGE)) == "sampled"
        await trace.flush()
        assert await trace.store.read("acme", None) == []
        await storage.close()

    asyncio.run(run())

