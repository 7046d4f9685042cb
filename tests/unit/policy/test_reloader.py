"""The policy holder on real directories: a changed valid set is installed and announced, an unchanged one is not,
a broken one is refused and counted while the last good set stays, and the salt-epoch gate (a real floor store on
SQLite) refuses a set that lowers an epoch on both the synchronous and the store-asking path."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.epochs.floor import open_floor_store
from gateway.epochs.guard import EpochFloorGuard
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.policy.reloader import PolicyHolder
from gateway.storage import Storage
from gateway.tasks import TaskSupervisor

GATEWAY: dict[str, Any] = {"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p"}


def write(root: Path, tenants: dict[str, dict[str, Any]], gateway: dict[str, Any] = GATEWAY) -> Path:
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    for old in (root / "tenants").glob("*.yaml"):
        old.unlink()
    for name, body in tenants.items():
        (root / "tenants" / f"{name}.yaml").write_text(yaml.safe_dump({"tenant": name, **body}))
    return root


def reloads(metrics: GatewayMetrics, result: str) -> float:
    return metrics.registry.get_sample_value("kvgate_policy_reloads_total", {"result": result}) or 0.0


def holder_on(root: Path) -> tuple[PolicyHolder, list[PolicySet]]:
    installed: list[PolicySet] = []
    holder = PolicyHolder(root, load_policy_set(root), GatewayMetrics(CollectorRegistry()))
    holder.listeners.append(installed.append)
    return holder, installed


def test_an_unchanged_directory_installs_nothing(tmp_path: Path) -> None:
    holder, installed = holder_on(write(tmp_path, {"acme": {}}))
    assert reloads(holder.metrics, "ok") == 1  # the initial set
    assert holder.reload() is False
    assert installed == [] and reloads(holder.metrics, "ok") == 1 and reloads(holder.metrics, "error") == 0


def test_a_changed_valid_set_is_installed_and_announced(tmp_path: Path) -> None:
    root = write(tmp_path, {"acme": {}})
    holder, installed = holder_on(root)
    first = holder.current.version
    write(root, {"acme": {}, "beta": {}})
    assert holder.reload() is True
    assert set(holder.current.tenants) == {"acme", "beta"} and holder.current.version != first
    assert installed == [holder.current]
    assert reloads(holder.metrics, "ok") == 2


@pytest.mark.parametrize("breakage", ["bad field", "bad yaml", "no directory"])
def test_a_broken_set_is_refused_counted_and_the_last_good_one_kept(tmp_path: Path, breakage: str) -> None:
    root = write(tmp_path / "policies", {"acme": {}})
    holder, installed = holder_on(root)
    good = holder.current
    if breakage == "bad field":
        write(root, {"acme": {"cache": {"salt_epoch": "one"}}})
    elif breakage == "bad yaml":
        (root / "tenants" / "acme.yaml").write_text("tenant: [acme\n")
    else:
        shutil.rmtree(root)
    assert holder.reload() is False
    assert holder.current is good and installed == []
    assert reloads(holder.metrics, "error") == 1
    assert holder.reload() is False  # still broken: refused again, counted again
    assert reloads(holder.metrics, "error") == 2
    write(root, {"acme": {}, "fixed": {}})
    assert holder.reload() is True and "fixed" in holder.current.tenants


def test_a_pool_key_missing_from_the_environment_refuses_the_set(tmp_path: Path) -> None:
    root = write(tmp_path, {"acme": {}})
    holder = PolicyHolder(root, load_policy_set(root, {}), GatewayMetrics(CollectorRegistry()), environ={})
    write(root, {"acme": {}}, {"pools": {"p": {"upstreams": ["http://a"], "api_key_env": "POOL_KEY"}},
                               "default_pool": "p"})
    assert holder.reload() is False
    assert reloads(holder.metrics, "error") == 1
    holder.environ = {"POOL_KEY": "k"}
    assert holder.reload() is True
    assert holder.current.pool_auth("p") == {"authorization": "Bearer k"}


def test_the_epoch_gate_refuses_a_lowered_epoch_on_both_paths(tmp_path: Path) -> None:
    async def run() -> None:
        root = write(tmp_path / "policies", {"acme": {"cache": {"salt_epoch": 3}}})
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        guard = EpochFloorGuard(await open_floor_store(storage))
        holder, installed = holder_on(root)
        await guard.start(holder.current)
        holder.gate = guard
        write(root, {"acme": {"cache": {"salt_epoch": 2}}})
        assert holder.reload() is False  # checked against the cached floors
        assert await holder.reload_async() is False  # checked in the store
        assert holder.current.tenants["acme"].cache.salt_epoch == 3 and installed == []
        assert reloads(holder.metrics, "error") == 2
        write(root, {"acme": {"cache": {"salt_epoch": 4}}})
        assert await holder.reload_async() is True
        assert await (await open_floor_store(storage)).floors() == {"acme": 4}  # raised as it was admitted
        await storage.close()

    asyncio.run(run())


def test_a_requested_reload_wakes_the_watcher_long_before_its_interval(tmp_path: Path) -> None:
    async def run() -> None:
        root = write(tmp_path, {"acme": {}})
        holder, installed = holder_on(root)
        tasks = TaskSupervisor("test-policy-watch")
        tasks.spawn(holder.watch(interval_s=3600.0), "policy-watch")  # only a wake-up can make it look
        write(root, {"acme": {}, "beta": {}})
        holder.request_reload()  # what SIGHUP does
        deadline = asyncio.get_running_loop().time() + 10  # bounds the wait; the event is the install
        while not installed:
            assert asyncio.get_running_loop().time() < deadline, "the watcher did not wake"
            await asyncio.sleep(0.01)
        await tasks.close()
        assert set(installed[0].tenants) == {"acme", "beta"}

    asyncio.run(run())
