"""The reuse trace through a real gateway and simulator: chains without text, per-tenant keys, `tenant forget`,
retention, the SHARDS bound, and `GET /admin/plan`."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from gateway.devtools.loadtest.workload_stack import sim_argv, started
from gateway.devtools.localproc import free_port, kvgate_command
from gateway.proxy.rawprompt import RAW_PROMPT_BYTES
from gateway.reuse.record import TraceRecord, decode_record
from gateway.reuse.sampling import root_value, threshold_for_rate
from gateway.reuse.store import trace_store_for
from tests.harness import PolicyDir, bearer, expected_salt, new_secret
from tests.ledger.redis_proc import RedisProcess

MARKER = "zebra-quartz-marker"


@dataclass
class Stack:
    url: str
    policies: PolicyDir
    state: Path
    secret: str
    sim_url: str


def _stack(tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[Stack]:
    sim_port, gateway_port = free_port(), free_port()
    policies = PolicyDir(tmp_path / "policies", {"main": {"upstreams": [f"http://127.0.0.1:{sim_port}"]}})
    for tenant in ("acme", "globex", "forgetme", "longdoc", "longids"):
        policies.add_tenant(tenant)
    policies.add_tenant("peruser", cache={"isolation": "user"})
    policies.add_tenant("brief", offload={"retention_seconds": 2})
    policies.add_tenant("root", scopes=("admin",))
    policies.write()
    secret, state = new_secret(), tmp_path / "state.sqlite3"
    gateway_env = {"KVGATE_SALT_SECRET": secret, "KVGATE_STATE_PATH": str(state), "KVGATE_RELOAD_INTERVAL_S": "0.2",
                   **(env or {})}
    argv = kvgate_command("serve", "--policies", str(policies.root), "--port", str(gateway_port))
    with started({"sim": (sim_argv(sim_port, 10**9), sim_port)}, tmp_path, "/health") as sims, \
            started({"gateway": (argv, gateway_port)}, tmp_path, "/livez", gateway_env) as gateway:
        yield Stack(gateway["gateway"].url, policies, state, secret, sims["sim"].url)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from _stack(tmp_path_factory.mktemp("trace"))


def records(state: Path, tenant: str) -> list[TraceRecord]:
    if not state.exists():
        return []
    with sqlite3.connect(state) as db:
        try:
            rows = db.execute("SELECT record FROM reuse_trace WHERE tenant = ? ORDER BY id", (tenant,)).fetchall()
        except sqlite3.OperationalError:
            return []
    return [decode_record(row[0]) for row in rows]


def wait_records(state: Path, tenant: str, count: int, timeout_s: float = 30.0) -> list[TraceRecord]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = records(state, tenant)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{tenant}: {len(records(state, tenant))} trace records, expected {count}")


def client(stack: Stack, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.policies.keys[tenant], max_retries=0, timeout=30)


def document(words: int) -> str:
    return " ".join(f"{MARKER}-{i}" for i in range(words))


def test_chains_without_text_or_salts_and_keys_per_tenant(stack: Stack) -> None:
    doc = document(60)
    for tenant in ("acme", "globex"):
        openai_client = client(stack, tenant)
        openai_client.completions.create(model="m", prompt=doc + " first question?", max_tokens=2)
        openai_client.completions.create(model="m", prompt=doc + " and a longer one" * 20, max_tokens=2)
        openai_client.completions.create(model="m", prompt=list(range(3, 103)), max_tokens=2)
        openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": doc}], max_tokens=2)
    acme, globex = wait_records(stack.state, "acme", 4), wait_records(stack.state, "globex", 4)
    first, second, ids, chat = acme
    shared = _common_prefix(first.fingerprint_list(), second.fingerprint_list())
    assert shared == len(doc) // 16 < second.chunks  # the document's whole chunks (1 char per token x 16)
    assert (ids.text, ids.prompt_tokens, ids.chunks, ids.tokens_per_chunk) == (False, 100, 6, 16.0)
    assert chat.text and first.text
    assert first.prompt_tokens == len((doc + " first question?").encode())  # the simulator: one token per byte
    assert not set(_all(acme)) & set(_all(globex))  # the same prompts under two tenants' keys never match
    stored = b"".join(path.read_bytes() for path in stack.state.parent.glob(f"{stack.state.name}*"))
    assert MARKER.encode() not in stored
    for tenant in ("acme", "globex"):
        assert expected_salt(stack.secret, tenant).encode() not in stored


def test_long_prompts_forwarded_as_json_text_are_traced_after_the_reply(stack: Stack) -> None:
    """Prompts past RAW_PROMPT_BYTES stay the client's JSON text on the request path; the trace decodes them once
    the reply is sent, and their chains match as the short prompts' do."""
    doc = document(420)  # about 10 KB: past RAW_PROMPT_BYTES, within the simulator's 16k-token context
    assert len(doc) > RAW_PROMPT_BYTES
    openai_client = client(stack, "longdoc")
    openai_client.completions.create(model="m", prompt=doc + " first question?", max_tokens=2)
    openai_client.completions.create(model="m", prompt=doc + " and a longer one" * 20, max_tokens=2)
    openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": doc}], max_tokens=2)
    first, second, chat = wait_records(stack.state, "longdoc", 3)
    assert _common_prefix(first.fingerprint_list(), second.fingerprint_list()) == len(doc) // 16 < second.chunks
    assert first.prompt_tokens == len((doc + " first question?").encode())
    assert chat.text and chat.chunks > 0


def test_long_token_id_lists_are_traced_alike_in_any_serialisation(stack: Stack) -> None:
    """A token-id list past RAW_PROMPT_BYTES stays JSON text; the trace samples it from its head after the reply and
    decodes it a piece at a time in the background. Written compactly, with spaces or one id a line (the last too
    wide for its head, so decoded whole), the same ids give the same chain, exactly one fingerprint a block."""
    shared = [(i * 7919) % 30_000 + 3 for i in range(2_500)]
    ids = shared + list(range(5, 5 + 1_000))
    bodies = [json.dumps({"model": "m", "prompt": ids, "max_tokens": 1}, separators=(",", ":")),
              json.dumps({"model": "m", "prompt": ids, "max_tokens": 1}),
              json.dumps({"model": "m", "prompt": [*shared, *range(9, 9 + 600)], "max_tokens": 1}),
              '{"model": "m", "max_tokens": 1, "prompt": [' + ",".join(f"\n{i:>40}" for i in ids) + "]}"]
    headers = {**bearer(stack.policies.keys["longids"]), "content-type": "application/json"}
    for body in bodies:
        assert len(body) > 2 * RAW_PROMPT_BYTES
        reply = httpx.post(f"{stack.url}/v1/completions", content=body, headers=headers, timeout=30)
        assert reply.status_code == 200, reply.text
    compact, spaced, other, wide = wait_records(stack.state, "longids", 4)
    assert compact.chain == spaced.chain == wide.chain
    assert (compact.text, compact.prompt_tokens, compact.chunks) == (False, len(ids), len(ids) // 16)
    assert _common_prefix(compact.fingerprint_list(), other.fingerprint_list()) == len(shared) // 16
    assert other.chunks == (len(shared) + 600) // 16


def test_per_user_isolation_keeps_users_apart(stack: Stack) -> None:
    openai_client = client(stack, "peruser")
    for user in ("ann", "bob", "ann"):
        openai_client.completions.create(model="m", prompt=list(range(3, 83)), max_tokens=2, user=user)
    ann, bob, ann_again = wait_records(stack.state, "peruser", 3)
    assert ann.chain == ann_again.chain  # the same user's cache is shared with herself
    assert not set(ann.fingerprint_list()) & set(bob.fingerprint_list())  # vLLM would not share these blocks


def test_chunk_size_follows_observed_chars_per_token(stack: Stack) -> None:
    openai_client = client(stack, "globex")
    for index in range(5):
        openai_client.completions.create(model="m", prompt=document(30) + f" q{index}", max_tokens=2)
    trace = wait_records(stack.state, "globex", 9)
    text = [record for record in trace if record.text]
    assert text and all(record.chunk_units == 16 for record in text)  # not 64 = 16 x the default 4 chars/token
    assert text[-1].tokens_per_chunk == pytest.approx(16.0, rel=0.01)  # the simulator: 1 character per token


def test_tenant_forget_erases_the_trace(stack: Stack) -> None:
    openai_client = client(stack, "forgetme")
    for index in range(3):
        openai_client.completions.create(model="m", prompt=list(range(3 + index, 70 + index)), max_tokens=2)
    assert {r.epoch for r in wait_records(stack.state, "forgetme", 3)} == {1}
    others = len(records(stack.state, "acme"))
    env = {**os.environ, "KVGATE_STATE_PATH": str(stack.state)}
    done = subprocess.run([sys.executable, "-m", "gateway", "tenant", "forget", "forgetme", "--policies",
                           str(stack.policies.root)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "erased 3 reuse-trace records" in done.stdout
    assert records(stack.state, "forgetme") == []
    assert len(records(stack.state, "acme")) == others
    deadline = time.monotonic() + 30
    while True:  # after the reload, new requests are recorded under the new epoch
        openai_client.completions.create(model="m", prompt=list(range(5, 90)), max_tokens=2)
        found = records(stack.state, "forgetme")
        if found and found[-1].epoch == 2:
            break
        assert time.monotonic() < deadline, "the gateway never recorded under the new salt epoch"
        time.sleep(0.2)
    assert {r.epoch for r in records(stack.state, "forgetme")} == {2}


def test_retention_removes_old_records(stack: Stack) -> None:
    client(stack, "brief").completions.create(model="m", prompt=list(range(3, 80)), max_tokens=2)
    client(stack, "acme").completions.create(model="m", prompt=list(range(4, 80)), max_tokens=2)
    assert wait_records(stack.state, "brief", 1)
    deadline = time.monotonic() + 30
    while records(stack.state, "brief"):
        assert time.monotonic() < deadline, "a record older than retention_seconds stayed"
        time.sleep(0.1)
    assert records(stack.state, "acme")  # no retention there


def test_admin_plan(stack: Stack) -> None:
    openai_client = client(stack, "acme")
    before = len(records(stack.state, "acme"))
    for index in range(4):
        openai_client.completions.create(model="m", prompt=list(range(10, 200)) + [index] * 20, max_tokens=2)
    wait_records(stack.state, "acme", before + 4)
    admin = bearer(stack.policies.keys["root"])
    reply = httpx.get(f"{stack.url}/admin/plan?tenant=acme&window=1m,1h&cpu_bytes=1000000000", headers=admin,
                      timeout=60)
    assert reply.status_code == 200, reply.text
    plan = reply.json()
    assert plan["trace"]["records"] >= 4 and plan["pool"] == "main"
    assert plan["kv"]["bytes_per_token"] == pytest.approx(147456, rel=0.001)  # the simulator's cache_config_info
    assert plan["budgets"]["host_ram_bytes"] is None and "host_ram" in plan["budgets"]["unknown"]
    assert [w["window_s"] for w in plan["working_set"]] == [60.0, 3600.0]
    assert plan["curve"] and len(plan["evaluated"]) == 1
    for query, status, param in (("tenant=nope", 404, "tenant"), ("window=soon", 400, "window"),
                                 ("host_ram=-5", 400, "host_ram"), ("link_gbps=0", 400, "link_gbps")):
        bad = httpx.get(f"{stack.url}/admin/plan?{query}", headers=admin, timeout=30)
        assert (bad.status_code, bad.json()["error"]["param"]) == (status, param)
    forbidden = httpx.get(f"{stack.url}/admin/plan", headers=bearer(stack.policies.keys["acme"]), timeout=30)
    assert forbidden.status_code == 403


def test_sampling_keeps_a_bounded_set_of_roots(tmp_path: Path) -> None:
    for stack in _stack(tmp_path, {"KVGATE_REUSE_MAX_ROOTS": "2"}):
        openai_client = client(stack, "acme")
        for index in range(12):
            openai_client.completions.create(model="m", prompt=[7 + index] * 40, max_tokens=2)
        deadline = time.monotonic() + 30
        while not (trace := records(stack.state, "acme")) or min(r.rate for r in trace) == 1.0:
            assert time.monotonic() < deadline, "the sampling rate never fell"
            time.sleep(0.1)
        threshold = threshold_for_rate(min(r.rate for r in trace))
        kept_roots = {r.chain[:8] for r in trace if root_value(r.chain[:8]) < threshold}
        assert 1 <= len(kept_roots) <= 2
        assert len(trace) < 12  # roots above the falling threshold were not recorded


def _common_prefix(left: list[bytes], right: list[bytes]) -> int:
    count = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        count += 1
    return count


def _all(trace: list[TraceRecord]) -> list[bytes]:
    return [fp for record in trace for fp in record.fingerprint_list()]


def test_trace_in_redis_read_by_kvgate_plan_and_erased_by_forget(tmp_path: Path) -> None:
    redis_server = RedisProcess(tmp_path / "redis").start()
    try:
        for stack in _stack(tmp_path, {"KVGATE_REDIS_URL": redis_server.url}):
            openai_client = client(stack, "acme")
            for index in range(3):
                openai_client.completions.create(model="m", prompt=[5 + index] * 48, max_tokens=2)
            deadline = time.monotonic() + 30
            while len(redis_records(redis_server.url, "acme")) < 3:
                assert time.monotonic() < deadline, "the trace never reached Redis"
                time.sleep(0.1)
            assert not records(stack.state, "acme")  # nothing in the SQLite file
            env = {**os.environ, "KVGATE_REDIS_URL": redis_server.url, "KVGATE_STATE_PATH": str(stack.state)}
            done = subprocess.run([sys.executable, "-m", "gateway", "plan", "--tenant", "acme", "--format", "json",
                                   "--metrics", f"{stack.sim_url}/metrics"], env=env, capture_output=True, text=True,
                                  timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["trace"]["records"] == 3
            assert json.loads(done.stdout)["budgets"]["cache_process_rss_bytes"] is None  # not read: unknown
            cache_metrics = tmp_path / "lmcache-server-metrics.txt"  # an LMCache MP server's page, as it shows RSS
            cache_metrics.write_text("# TYPE process_resident_memory_bytes gauge\n"
                                     "process_resident_memory_bytes 1.234567e+10\n")
            done = subprocess.run([sys.executable, "-m", "gateway", "plan", "--tenant", "acme", "--format", "json",
                                   "--metrics", f"{stack.sim_url}/metrics", "--cache-server-metrics",
                                   str(cache_metrics)], env=env, capture_output=True, text=True, timeout=60,
                                  check=False)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["budgets"]["cache_process_rss_bytes"] == 12_345_670_000
            done = subprocess.run([sys.executable, "-m", "gateway", "tenant", "forget", "acme", "--policies",
                                   str(stack.policies.root)], env=env, capture_output=True, text=True, timeout=60,
                                  check=False)
            assert done.returncode == 0 and "erased 3 reuse-trace records" in done.stdout, done.stderr
            assert redis_records(redis_server.url, "acme") == []
    finally:
        redis_server.stop()


def redis_records(url: str, tenant: str) -> list[TraceRecord]:
    async def read() -> list[TraceRecord]:
        async with trace_store_for(url, Path("unused.sqlite3")) as store:
            return await store.read(tenant, None)

    return asyncio.run(read())
