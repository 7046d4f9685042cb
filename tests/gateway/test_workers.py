"""`kvgate serve --workers 2`: real worker processes behind one port, observed from outside.

Which worker answered is read from the `x-kvgate-worker` header of the gateway's own endpoints; worker pids
from the parent's JSON log. Every wait polls an observable event against a deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_with_kv_events, standard_policy
from tests.harness import PolicyDir, bearer, new_secret
from tests.ledger.redis_proc import RedisProcess
from tests.ledger.support import counts
from tests.procs import ServerProcess, clean_environment, free_port, kvgate_command, run_server

WORKERS = 2
DEADLINE_S = 120.0  # only bounds the wait: N workers starting on a loaded 2-core CI box can take long
WORKER_HEADER = "x-kvgate-worker"
PROMPT_CHARS = 512
BLOCKS_PER_PROMPT = 32  # the simulator: one token per byte, 16-token blocks


def gateway_env(log_dir: Path, **extra: str) -> dict[str, str]:
    # Reloads come only from signals and the admin endpoint here: the directory watcher would otherwise pick
    # edits up in every worker by itself and hide a reload that never reached one.
    return {"KVGATE_SALT_SECRET": new_secret(), "KVGATE_RELOAD_INTERVAL_S": "3600",
            "KVGATE_STATE_PATH": str(log_dir / "state.sqlite3"), UPSTREAM_KEY_ENV: UPSTREAM_KEY, **extra}


@contextmanager
def run_workers(policy_root: Path, log_path: Path, env: dict[str, str]) -> Iterator[ServerProcess]:
    port = free_port()
    argv = kvgate_command("serve", "--policies", str(policy_root), "--port", str(port), "--workers", str(WORKERS))
    with run_server(argv, port, log_path, env=env) as server:
        wait_for(lambda: len(log_events(server, "workers_ready")) == 1, server, "every worker ready")
        yield server


def wait_for(check: Callable[[], bool], server: ServerProcess, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_S}s\n{server.log_text()[-4000:]}"
        time.sleep(0.05)  # polling an observable event, not synchronisation


def log_events(server: ServerProcess, event: str) -> list[dict[str, Any]]:
    found = []
    for line in server.log_text().splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


def worker_pid(server: ServerProcess, index: int) -> int:
    started = [record for record in log_events(server, "worker_started") if record["worker"] == index]
    pid: int = started[-1]["pid"]
    return pid


def from_each_worker(server: ServerProcess, path: str, headers: dict[str, str] | None = None,
                     method: str = "GET") -> dict[int, httpx.Response]:
    """Ask on fresh connections until every worker has answered once; each worker's latest answer."""
    answers: dict[int, httpx.Response] = {}

    def asked() -> bool:
        reply = httpx.request(method, f"{server.url}{path}", headers=headers, timeout=DEADLINE_S)
        answers[int(reply.headers[WORKER_HEADER])] = reply
        return len(answers) == WORKERS

    wait_for(asked, server, f"an answer from each worker on {path}")
    return answers


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: ServerProcess, key: str) -> Samples:
    reply = httpx.get(f"{server.url}/metrics", headers=bearer(key), timeout=DEADLINE_S)
    assert reply.status_code == 200, reply.text
    return parsed_samples(reply.text)


def parsed_samples(text: str) -> Samples:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels` (0 when none)."""
    return sum(value for (sample_name, sample_labels), value in samples.items()
               if sample_name == name and set(labels.items()) <= set(sample_labels))


@pytest.fixture
def policy(sim: ServerProcess, tmp_path: Path) -> PolicyDir:
    written = standard_policy(tmp_path / "policies", sim.url)
    written.write()
    return written


@pytest.mark.parametrize("listen", ["shared", "reuseport"])
def test_requests_spread_over_workers_and_one_scrape_sums_them(policy: PolicyDir, tmp_path: Path, listen: str) -> None:
    """Wrong version: each worker exposes only its own registry, so a scrape shows one worker's share."""
    env = gateway_env(tmp_path, KVGATE_WORKERS_LISTEN=listen)
    with run_workers(policy.root, tmp_path / "gateway.log", env) as gateway:
        served: dict[int, int] = {}

        def both_served() -> bool:
            reply = httpx.get(f"{gateway.url}/admin/policies", headers=bearer(policy.keys["root"]),
                              timeout=DEADLINE_S)
            index = int(reply.headers[WORKER_HEADER])
            served[index] = served.get(index, 0) + 1
            return len(served) == WORKERS

        wait_for(both_served, gateway, "both workers serving")
        samples = scrape(gateway, policy.keys["ops"])
        assert sample(samples, "kvgate_requests_total", route="/admin/policies") == sum(served.values())
        assert sample(samples, "kvgate_request_duration_seconds_count", route="/admin/policies") == sum(
            served.values())
        assert sample(samples, "kvgate_workers") == WORKERS
        assert sample(samples, "kvgate_worker_restarts_total") == 0


def test_sighup_and_the_reload_endpoint_reach_every_worker(policy: PolicyDir, tmp_path: Path) -> None:
    """Wrong version: the parent keeps SIGHUP (or the endpoint reloads only the worker it reached)."""
    root = policy.keys["root"]
    with run_workers(policy.root, tmp_path / "gateway.log", gateway_env(tmp_path)) as gateway:
        first = {reply.json()["policy_version"] for reply in
                 from_each_worker(gateway, "/admin/policies", bearer(root)).values()}
        assert len(first) == 1
        policy.add_key("acme", ("inference",))
        policy.write_tenant("acme", policy.tenants["acme"])
        gateway.send_signal(signal.SIGHUP)
        assert_every_worker_moves_on(gateway, root, first)

        second = {reply.json()["policy_version"] for reply in
                  from_each_worker(gateway, "/admin/policies", bearer(root)).values()}
        policy.tenants["acme"]["cache"] = {"salt_epoch": 3}
        policy.write_tenant("acme", policy.tenants["acme"])
        reload = httpx.post(f"{gateway.url}/admin/reload", headers=bearer(root), timeout=DEADLINE_S)
        assert reload.status_code == 200 and reload.json()["reloaded"] is True
        assert_every_worker_moves_on(gateway, root, second)


def assert_every_worker_moves_on(gateway: ServerProcess, key: str, old: set[str]) -> None:
    moved: dict[int, str] = {}

    def every_worker_moved() -> bool:
        reply = httpx.get(f"{gateway.url}/admin/policies", headers=bearer(key), timeout=DEADLINE_S)
        version: str = reply.json()["policy_version"]
        if version not in old:
            moved[int(reply.headers[WORKER_HEADER])] = version
        return len(moved) == WORKERS

    wait_for(every_worker_moved, gateway, "every worker on the new policy version")
    assert len(set(moved.values())) == 1


def test_a_killed_worker_is_replaced_with_its_index_and_counted(policy: PolicyDir, tmp_path: Path) -> None:
    """Wrong version: the parent does not notice, and the port is served by one worker from then on."""
    with run_workers(policy.root, tmp_path / "gateway.log", gateway_env(tmp_path)) as gateway:
        counted_before_kill = scrape_until_every_worker_counted(gateway, policy.keys["ops"])
        victim = worker_pid(gateway, 1)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: worker_pid(gateway, 1) != victim, gateway, "a replacement for worker 1")
        replacement = worker_pid(gateway, 1)
        wait_for(lambda: any(record["pid"] == replacement for record in log_events(gateway, "worker_ready")),
                 gateway, "the replacement ready")
        exited = [record for record in log_events(gateway, "worker_exited") if record["pid"] == victim]
        assert exited[0]["exit_code"] == -signal.SIGKILL
        assert set(from_each_worker(gateway, "/livez")) == {0, 1}
        samples = scrape(gateway, policy.keys["ops"])
        assert sample(samples, "kvgate_worker_restarts_total") == 1
        assert sample(samples, "kvgate_workers") == WORKERS  # the dead worker's live gauge left the sum
        # What the killed worker served stays counted: no /metrics request was sent between the two readings.
        assert sample(samples, "kvgate_requests_total", route="/metrics") >= counted_before_kill


def scrape_until_every_worker_counted(gateway: ServerProcess, key: str) -> float:
    """Scrape /metrics on fresh connections until both workers have answered an earlier scrape and the summed
    `kvgate_requests_total{route="/metrics"}` covers every earlier scrape: a worker counts a request after its
    answer has gone out, so a worker killed right after answering could otherwise take that count with it. Returns
    the count then, which includes the killed worker's share."""
    answered: set[int] = set()
    sent = 0
    counted = 0.0

    def earlier_scrapes_all_counted() -> bool:
        nonlocal sent, counted
        answered_before, sent_before = set(answered), sent
        reply = httpx.get(f"{gateway.url}/metrics", headers=bearer(key), timeout=DEADLINE_S)
        assert reply.status_code == 200, reply.text
        sent += 1
        answered.add(int(reply.headers[WORKER_HEADER]))
        counted = sample(parsed_samples(reply.text), "kvgate_requests_total", route="/metrics")  # not this scrape
        return answered_before == {0, 1} and counted >= sent_before

    wait_for(earlier_scrapes_all_counted, gateway, "every worker's earlier scrapes counted")
    return counted


def test_sigterm_drains_every_worker_and_exits_zero(policy: PolicyDir, tmp_path: Path) -> None:
    with run_workers(policy.root, tmp_path / "gateway.log", gateway_env(tmp_path)) as gateway:
        pids = [worker_pid(gateway, index) for index in range(WORKERS)]
        gateway.send_signal(signal.SIGTERM)
        assert gateway.popen.wait(timeout=DEADLINE_S) == 0
        assert {record["exit_code"] for record in log_events(gateway, "worker_exited")} == {0}
        for pid in pids:
            assert not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_worker_that_cannot_start_fails_the_whole_server(policy: PolicyDir, tmp_path: Path) -> None:
    """The store's directory is a regular file: each worker's start-up fails (the parent's checks of settings and
    policies pass). Wrong version: the parent keeps restarting them and never exits, or exits 0."""
    (tmp_path / "not-a-directory").write_text("")
    state_path = tmp_path / "not-a-directory" / "state.sqlite3"
    env = clean_environment(gateway_env(tmp_path, KVGATE_STATE_PATH=str(state_path)))
    argv = kvgate_command("serve", "--policies", str(policy.root), "--port", str(free_port()),
                          "--workers", str(WORKERS))
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=DEADLINE_S).returncode
    assert code == 3, log_path.read_text()  # the single-process server's status for a failed start-up
    assert '"worker_startup_failed"' in log_path.read_text()


# -- KV events: one subscriber per source on the host, and one answer from every worker ------------------


@pytest.fixture
def sim_with_events(tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    with sim_with_kv_events(tmp_path / "sim") as found:
        yield found


def ledger_env(log_dir: Path) -> dict[str, str]:
    return gateway_env(log_dir, KVGATE_LEDGER_FLUSH_INTERVAL_S="0.05", KVGATE_LEDGER_REPLAY_TIMEOUT_S="0.5",
                       KVGATE_LEDGER_PROBE_INTERVAL_S="0.3", KVGATE_LEDGER_LOST_AFTER_S="60",
                       KVGATE_LEDGER_SALT_REFRESH_S="0.1")


def complete(gateway: ServerProcess, key: str, label: str) -> None:
    body = {"model": SIM_MODEL, "prompt": f"{label} document ".ljust(PROMPT_CHARS, "x"), "max_tokens": 1}
    reply = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=DEADLINE_S)
    assert reply.status_code == 200, reply.text


def totals(report: dict[str, Any]) -> dict[str, dict[str, tuple[int, int, int]]]:
    """Block totals per tenant and medium (the report's ages move with the clock, so they are left out)."""
    return {tenant: {medium: counts(report, tenant, medium) for medium in media}
            for tenant, media in report["tenants"].items() if tenant == "acme"}


def acme_stored(gateway: ServerProcess, root: str) -> int:
    reply = httpx.get(f"{gateway.url}/admin/audit", headers=bearer(root), timeout=DEADLINE_S)
    assert reply.status_code == 200, reply.text
    return counts(reply.json(), "acme", "GPU")[0]


@pytest.fixture(params=["sqlite", "redis"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The workers' shared store: the SQLite file, or a real redis-server."""
    if request.param == "sqlite":
        yield {}
        return
    server = RedisProcess(tmp_path / "redis").start()
    try:
        yield {"KVGATE_REDIS_URL": server.url, "KVGATE_LEDGER_REDIS_PREFIX": f"kvgate-test:{uuid.uuid4().hex}:"}
    finally:
        server.stop()


def test_kv_events_are_ingested_once_and_every_worker_gives_the_same_audit(
    sim_with_events: tuple[ServerProcess, int], tmp_path: Path, store_env: dict[str, str]
) -> None:
    """Wrong versions: every worker subscribes (each block counted once per worker in the summed metrics), or a
    worker answers the audit from its own memory (its answer differs, or misses the unflushed batches)."""
    sim, events = sim_with_events
    pools = {"offload": {"upstreams": [sim.url], "api_key_env": UPSTREAM_KEY_ENV,
                         "kv_events": [f"tcp://127.0.0.1:{events}"]}}
    policy = PolicyDir(tmp_path / "policies", pools)
    policy.add_tenant("acme")
    policy.add_tenant("root", scopes=("admin", "metrics"))
    policy.write()
    root = policy.keys["root"]
    with run_workers(policy.root, tmp_path / "gateway.log", {**ledger_env(tmp_path), **store_env}) as gateway:
        wait_for(lambda: len(log_events(gateway, "kv_events_subscribed")) == 1, gateway, "a subscription")
        complete(gateway, policy.keys["acme"], "first")
        wait_for(lambda: acme_stored(gateway, root) == BLOCKS_PER_PROMPT, gateway, "the first prompt's blocks")
        audits = from_each_worker(gateway, "/admin/audit", bearer(root))
        assert {index: totals(reply.json()) for index, reply in audits.items()} == {
            0: {"acme": {"GPU": (32, 0, 32), "CPU": (0, 0, 0)}}, 1: {"acme": {"GPU": (32, 0, 32), "CPU": (0, 0, 0)}}}
        samples = scrape(gateway, root)
        assert sample(samples, "kvgate_kv_blocks_stored_total", tenant="acme", medium="GPU") == BLOCKS_PER_PROMPT
        assert sample(samples, "kvgate_kv_blocks_resident", tenant="acme", medium="GPU") == BLOCKS_PER_PROMPT
        assert {record["worker"] for record in log_events(gateway, "kv_events_subscribed")} == {0}

        # The ingesting worker dies: its replacement (index 0 again) picks the source up where the store says.
        victim = worker_pid(gateway, 0)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: worker_pid(gateway, 0) != victim, gateway, "a replacement for worker 0")
        wait_for(lambda: len(log_events(gateway, "kv_events_subscribed")) == 2, gateway, "the replacement subscribed")
        complete(gateway, policy.keys["acme"], "second")
        wait_for(lambda: acme_stored(gateway, root) == 2 * BLOCKS_PER_PROMPT, gateway, "the second prompt's blocks")
        samples = scrape(gateway, root)
        assert sample(samples, "kvgate_kv_blocks_stored_total", tenant="acme", medium="GPU") == 2 * BLOCKS_PER_PROMPT
        assert {record["worker"] for record in log_events(gateway, "kv_events_subscribed")} == {0}


def test_user_salts_issued_by_any_worker_attribute_their_blocks(
    sim_with_events: tuple[ServerProcess, int], tmp_path: Path
) -> None:
    """`isolation: user`: each new user's salt is issued by whichever worker serves the request, while only
    worker 0 reads the KV events. Wrong version: worker 0 learns the salts of the others too late, and those
    users' blocks are reported `unattributed`."""
    sim, events = sim_with_events
    pools = {"offload": {"upstreams": [sim.url], "api_key_env": UPSTREAM_KEY_ENV,
                         "kv_events": [f"tcp://127.0.0.1:{events}"]}}
    policy = PolicyDir(tmp_path / "policies", pools)
    policy.add_tenant("gamma", cache={"isolation": "user"})
    policy.add_tenant("root", scopes=("admin", "metrics"))
    policy.write()
    with run_workers(policy.root, tmp_path / "gateway.log", ledger_env(tmp_path)) as gateway:
        wait_for(lambda: len(log_events(gateway, "kv_events_subscribed")) == 1, gateway, "a subscription")
        sent = 0

        def served_by_both() -> bool:
            nonlocal sent
            body = {"model": SIM_MODEL, "prompt": f"user {sent} document ".ljust(PROMPT_CHARS, "x"), "max_tokens": 1,
                    "user": f"user-{sent}"}
            reply = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(policy.keys["gamma"]),
                               timeout=DEADLINE_S)
            assert reply.status_code == 200, reply.text
            sent += 1
            workers = {record.get("worker") for record in log_events(gateway, "request")
                       if record.get("tenant") == "gamma"}
            return workers >= {0, 1}

        wait_for(served_by_both, gateway, "user requests served by both workers")

        def report() -> dict[str, Any]:
            reply = httpx.get(f"{gateway.url}/admin/audit", headers=bearer(policy.keys["root"]), timeout=DEADLINE_S)
            result: dict[str, Any] = reply.json()
            return result

        expected = sent * BLOCKS_PER_PROMPT
        wait_for(lambda: sum(counts(report(), tenant, "GPU")[0] for tenant in ("gamma", "unattributed"))
                 == expected, gateway, "every block reported")
        assert counts(report(), "unattributed", "GPU") == (0, 0, 0)
        assert counts(report(), "gamma", "GPU")[0] == expected


def test_workers_end_by_themselves_when_the_parent_is_killed(policy: PolicyDir, tmp_path: Path) -> None:
    """SIGKILL gives the parent no chance to stop them. Wrong version: the workers keep serving the port as
    orphans nobody supervises."""
    with run_workers(policy.root, tmp_path / "gateway.log", gateway_env(tmp_path)) as gateway:
        pids = [worker_pid(gateway, index) for index in range(WORKERS)]
        gateway.popen.kill()
        gateway.popen.wait(timeout=DEADLINE_S)
        wait_for(lambda: not any(pid_alive(pid) for pid in pids), gateway, "every worker gone")
    # A killed parent cannot remove its runtime directory (metric files, private sockets); the test does.
    shutil.rmtree(log_events(gateway, "workers_starting")[0]["runtime_dir"], ignore_errors=True)


def test_an_invalid_worker_count_is_refused_before_anything_starts(policy: PolicyDir, tmp_path: Path) -> None:
    env = clean_environment(gateway_env(tmp_path))
    argv = kvgate_command("serve", "--policies", str(policy.root), "--port", str(free_port()), "--workers", "0")
    done = subprocess.run(argv, capture_output=True, env=env, timeout=DEADLINE_S)
    assert done.returncode == 2
    assert b"workers" in done.stderr


def test_every_worker_enforces_the_connection_limits(policy: PolicyDir, tmp_path: Path) -> None:
    """On one kept-alive connection: /livez says which worker holds it, then a request whose headers exceed
    KVGATE_MAX_HEADER_BYTES must get 431 from that worker. Wrong version: a worker serves with uvicorn's
    defaults (no header cap of ours), and the oversized request is answered normally."""
    env = gateway_env(tmp_path, KVGATE_MAX_HEADER_BYTES="2048")
    with run_workers(policy.root, tmp_path / "gateway.log", env) as gateway:
        refused_by: set[int] = set()

        def each_worker_refused() -> bool:
            connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=DEADLINE_S)
            try:
                connection.request("GET", "/livez")
                first = connection.getresponse()
                first.read()
                index = int(first.headers[WORKER_HEADER])
                connection.request("GET", "/livez", headers={"x-padding": "p" * 4096})
                second = connection.getresponse()
                second.read()
            finally:
                connection.close()
            assert second.status == 431, f"worker {index} answered {second.status}"
            refused_by.add(index)
            return len(refused_by) == WORKERS

        wait_for(each_worker_refused, gateway, "an oversized request refused by each worker")
        samples = scrape(gateway, policy.keys["ops"])
        assert sample(samples, "kvgate_connections_closed_total", reason="header_too_large") >= WORKERS
