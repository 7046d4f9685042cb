"""KV events over real ZMQ on loopback, compared with the captured vLLM 0.25.0 events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.procs import ServerProcess, free_port
from tests.sim.conftest import StartSim
from tests.sim.helpers import complete, words
from tests.sim.zmq_client import END_SEQ, Batch, Subscriber, captured_keys, replay

CHUNK_BYTES = 64 * 147456


class EventsServer:
    def __init__(self, server: ServerProcess, subscriber: Subscriber, replay_endpoint: str) -> None:
        self.server = server
        self.url = server.url
        self.subscriber = subscriber
        self.replay_endpoint = replay_endpoint

    def run(self, prompt: str, **extra: Any) -> list[Batch]:
        """One request; the batches it published."""
        complete(self.url, prompt, **extra)
        return self.subscriber.catch_up(self.url)


@pytest.fixture(scope="module")
def events_sim(start_sim: StartSim) -> Iterator[EventsServer]:
    """Offload tier of 32 chunks, 64 GPU blocks; PUB bound on a wildcard like vLLM's default, replay on loopback."""
    pub_port, replay_port = free_port(), free_port()
    replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
    flags = ("--offload", "--gpu-blocks", "64", "--cpu-bytes-to-use", str(32 * CHUNK_BYTES),
             "--kv-events-endpoint", f"tcp://*:{pub_port}", "--kv-events-replay-endpoint", replay_endpoint,
             "--kv-events-topic", "kv")
    with start_sim(*flags) as server:
        subscriber = Subscriber(f"tcp://127.0.0.1:{pub_port}")
        try:
            subscriber.warm_up(server.url)
            yield EventsServer(server, subscriber, replay_endpoint)
        finally:
            subscriber.close()


def of(batches: list[Batch], kind: str, medium: str | None) -> list[dict[str, Any]]:
    return [e for b in batches for e in b.events if e["type"] == kind and e.get("medium") == medium]


def test_wire_format_and_gpu_store(events_sim: EventsServer) -> None:
    batches = events_sim.run(words(256), cache_salt="tenant-x")
    seqs = [b.seq for b in events_sim.subscriber.received]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    for batch in batches:
        assert batch.topic == b"kv" and batch.payload[:2] == b"\x93\xcb"
        ts, _, rank = batch.decoded
        assert isinstance(ts, float) and rank == 0
    (stored,) = of(batches, "BlockStored", "GPU")
    assert list(stored) == captured_keys("offload", "BlockStored", "GPU")
    assert stored["extra_keys"] == [["tenant-x"]] + [None] * 15
    assert (stored["parent_block_hash"], stored["block_size"], len(stored["token_ids"])) == (None, 16, 256)
    assert stored["kv_cache_spec_kind"] == "full_attention" and stored["group_idx"] == 0
    assert all(0 <= h < 2**64 for h in stored["block_hashes"]) and len(set(stored["block_hashes"])) == 16


def test_cpu_placeholders_follow_the_gpu_store(events_sim: EventsServer) -> None:
    batches = events_sim.run(words(256))
    gpu_hashes = of(batches, "BlockStored", "GPU")[0]["block_hashes"]
    placeholders = of(batches, "BlockStored", "CPU")
    assert [e["block_hashes"] for e in placeholders] == [[gpu_hashes[i]] for i in (3, 7, 11, 15)]
    assert all(list(e) == captured_keys("offload", "BlockStored", "CPU") for e in placeholders)
    assert all((e["parent_block_hash"], e["token_ids"], e["block_size"]) == (None, [], 0) for e in placeholders)
    assert batches[-1].events == placeholders


def test_repeat_restores_only_the_recomputed_last_block(events_sim: EventsServer) -> None:
    prompt = words(256)
    first = of(events_sim.run(prompt), "BlockStored", "GPU")[0]["block_hashes"]
    again = events_sim.run(prompt)
    (stored,) = of(again, "BlockStored", "GPU")
    assert (stored["block_hashes"], stored["parent_block_hash"]) == ([first[-1]], first[-2])
    assert of(again, "BlockStored", "CPU") == []


def test_evictions_and_reset(events_sim: EventsServer) -> None:
    batches = [b for _ in range(5) for b in events_sim.run(words(512))]
    gpu_removed = of(batches, "BlockRemoved", "GPU")
    assert gpu_removed and all(len(e["block_hashes"]) == 1 for e in gpu_removed)
    assert all(list(e) == captured_keys("offload", "BlockRemoved", "GPU") for e in gpu_removed)
    cpu_removed = of(batches, "BlockRemoved", "CPU")
    assert cpu_removed and all(len(e["block_hashes"]) > 1 for e in cpu_removed)
    assert httpx.post(f"{events_sim.url}/reset_prefix_cache").json() == {"success": True}
    (cleared,) = events_sim.subscriber.catch_up(events_sim.url)
    assert cleared.events == [{"type": "AllBlocksCleared"}]


def test_replay_returns_the_published_batches(events_sim: EventsServer) -> None:
    live = events_sim.run(words(128))
    replies = replay(events_sim.replay_endpoint, live[0].seq)
    assert replies[-1] == [b"", b"", END_SEQ, b""]
    assert all(len(frames) == 4 and frames[:2] == [b"", b"kv"] for frames in replies[:-1])
    replayed = {int.from_bytes(frames[2], "big"): frames[3] for frames in replies[:-1]}
    assert {b.seq: b.payload for b in live}.items() <= replayed.items()
    assert min(replayed) == live[0].seq


@pytest.fixture(scope="module")
def selfdesc_sim(start_sim: StartSim) -> Iterator[EventsServer]:
    """Self-describing CPU events, 0.25.0-style replay, and a PUB that connects to a bound subscriber."""
    pub_port, replay_port = free_port(), free_port()
    subscriber = Subscriber(f"tcp://127.0.0.1:{pub_port}", bind=True)
    replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
    flags = ("--offload", "--self-describing-kv-events", "--replay-without-topic",
             "--kv-events-endpoint", f"tcp://127.0.0.1:{pub_port}", "--kv-events-replay-endpoint", replay_endpoint)
    try:
        with start_sim(*flags) as server:
            subscriber.warm_up(server.url)
            yield EventsServer(server, subscriber, replay_endpoint)
    finally:
        subscriber.close()


def test_self_describing_cpu_events(selfdesc_sim: EventsServer) -> None:
    batches = selfdesc_sim.run(words(128), cache_salt="tenant-y")
    gpu = of(batches, "BlockStored", "GPU")[0]
    cpu = of(batches, "BlockStored", "CPU")
    assert [e["block_hashes"] for e in cpu] == [gpu["block_hashes"][:4], gpu["block_hashes"][4:]]
    assert [e["parent_block_hash"] for e in cpu] == [None, gpu["block_hashes"][3]]
    assert [e["token_ids"] for e in cpu] == [gpu["token_ids"][:64], gpu["token_ids"][64:]]
    assert all(list(e) == captured_keys("selfdesc", "BlockStored", "CPU") for e in cpu)
    assert all(e["block_size"] == 16 and "extra_keys" not in e for e in cpu)


def test_replay_without_topic_frame(selfdesc_sim: EventsServer) -> None:
    live = selfdesc_sim.run(words(64))
    replies = replay(selfdesc_sim.replay_endpoint, live[-1].seq)
    assert replies == [[b"", live[-1].seq.to_bytes(8, "big"), live[-1].payload], [b"", END_SEQ, b""]]


def test_kv_truth_counts_what_was_sent_per_salt(events_sim: EventsServer) -> None:
    batches = events_sim.run(words(256), cache_salt="truth-salt")
    gpu = [h for e in of(batches, "BlockStored", "GPU") for h in e["block_hashes"]]
    cpu = [h for e in of(batches, "BlockStored", "CPU") for h in e["block_hashes"]]
    view = httpx.get(f"{events_sim.url}/sim/kv-truth").json()
    assert view["by_salt"]["truth-salt"] == {"CPU": {"stored": len(cpu), "removed": 0, "resident": len(cpu)},
                                             "GPU": {"stored": len(gpu), "removed": 0, "resident": len(gpu)}}
    assert (len(gpu), len(cpu)) == (16, 4)
    assert view["batches_sent"] >= events_sim.subscriber.received[-1].seq + 1
