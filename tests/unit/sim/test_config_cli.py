"""Settings, flags and the small plumbing around them (pure): every configuration rule, the flag parser feeding
SimConfig, the API key from the environment, the fingerprint, and the raw-ASGI request helpers."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest

from gateway.sim import cli
from gateway.sim.asgi import HttpRequest, Message, run_until_disconnect
from gateway.sim.config import SimConfig
from gateway.sim.state import SimState, fingerprint


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(flags))


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"port": 0}, "port must be positive"),
        ({"block_size": 0}, "block_size must be positive"),
        ({"gpu_blocks": -1}, "gpu_blocks must be positive"),
        ({"max_model_len": 0}, "max_model_len must be positive"),
        ({"record_limit": 0}, "record_limit must be positive"),
        ({"kv_events_hwm": 0}, "kv_events_hwm must be positive"),
        ({"lmcache_chunks": 0}, "lmcache_chunks must be positive"),
        ({"offload_block_size": 24}, "offload_block_size must be a multiple of block_size"),
        ({"offload": True, "lmcache": True}, "--offload and --lmcache are two KV connectors; a server has one"),
        ({"base_ttft_ms": -0.5}, "base_ttft_ms must not be negative"),
        ({"cpu_bytes_to_use": -1}, "cpu_bytes_to_use must not be negative"),
        ({"fail_loads": 1.01}, "fail_loads must be between 0 and 1"),
        ({"fail_loads": -0.01}, "fail_loads must be between 0 and 1"),
        ({"load_failure_policy": "retry"}, "load_failure_policy must be fail or recompute"),
    ],
)
def test_each_rule_refuses_its_setting(overrides: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        SimConfig(**overrides)
    assert str(caught.value) == problem


@pytest.mark.parametrize(
    "overrides",
    [{}, {"fail_loads": 0.0}, {"fail_loads": 1.0}, {"base_ttft_ms": 0.0}, {"cpu_bytes_to_use": 0},
     {"offload_block_size": 16}, {"block_size": 32, "offload_block_size": 64}, {"load_failure_policy": "recompute"}],
)
def test_boundary_settings_are_valid(overrides: dict[str, Any]) -> None:
    assert SimConfig(**overrides).problems() == []


def test_a_zero_block_size_is_reported_once() -> None:
    """The multiple-of check is skipped when block_size itself is invalid (no division by zero)."""
    with pytest.raises(ValueError) as caught:
        SimConfig(block_size=0)
    assert str(caught.value) == "block_size must be positive"


@pytest.mark.parametrize(("block_size", "offload_block_size", "per_chunk"), [(16, 64, 4), (16, 16, 1), (32, 256, 8)])
def test_blocks_per_chunk(block_size: int, offload_block_size: int, per_chunk: int) -> None:
    assert SimConfig(block_size=block_size, offload_block_size=offload_block_size).blocks_per_chunk == per_chunk


def test_the_defaults_parse_to_the_default_config() -> None:
    assert SimConfig.from_namespace(parse()) == SimConfig()


def test_flags_reach_the_config() -> None:
    config = SimConfig.from_namespace(parse(
        "--port", "9001", "--model", "m", "--api-key", "a", "--api-key", "b", "--offload",
        "--cpu-bytes-to-use", "1e9", "--offload-block-size", "32", "--fail-loads", "0.25",
        "--load-failure-policy", "recompute", "--kv-events-endpoint", "tcp://*:5557", "--replay-without-topic",
        "--ignore-max-load-tokens", "--self-describing-kv-events", "--enable-request-id-headers"))
    assert (config.port, config.model, config.api_keys) == (9001, "m", ("a", "b"))
    assert (config.offload, config.cpu_bytes_to_use, config.offload_block_size) == (True, 1_000_000_000, 32)
    assert (config.fail_loads, config.load_failure_policy) == (0.25, "recompute")
    assert (config.kv_events_endpoint, config.events_enabled, config.replay_without_topic) == (
        "tcp://*:5557", True, True)
    assert config.ignore_max_load_tokens and config.self_describing_kv_events and config.enable_request_id_headers


def test_namespace_attributes_the_config_lacks_are_ignored() -> None:
    namespace = argparse.Namespace(port=9, command="sim", verbose=True, model=None)
    config = SimConfig.from_namespace(namespace)
    assert (config.port, config.model) == (9, "sim-model")  # None keeps the default


def test_an_invalid_policy_flag_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        parse("--load-failure-policy", "retry")


@pytest.mark.parametrize(
    ("flags", "environment", "keys"),
    [
        ((), {}, ()),
        ((), {"VLLM_API_KEY": "env-key"}, ("env-key",)),
        ((), {"VLLM_API_KEY": ""}, ()),
        (("--api-key", "flag-key"), {"VLLM_API_KEY": "env-key"}, ("flag-key",)),  # the flag wins
    ],
)
def test_the_api_key_from_flags_or_the_environment(flags: tuple[str, ...], environment: dict[str, str],
                                                    keys: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert cli.build_config(parse(*flags)).api_keys == keys


def test_run_refuses_invalid_settings_with_status_2() -> None:
    assert cli.run(parse("--offload", "--lmcache")) == 2


@pytest.mark.parametrize(("model", "seed", "version", "expected"),
                         [("sim-model", 0, "0.25.0", "vllm-0.25.0-21907750"),
                          ("m", 7, "0.33.1", "vllm-0.33.1-faf3413d")])
def test_the_fingerprint_is_vllms_form_and_stable(model: str, seed: int, version: str, expected: str) -> None:
    """Literal values: the first 8 hex digits of SHA-256("<model>:<seed>"), computed outside the product."""
    config = SimConfig(model=model, seed=seed, vllm_version=version)
    assert fingerprint(config) == expected
    assert SimState.build(config).fingerprint == expected


# --- raw-ASGI helpers -----------------------------------------------------------------------------------------


def scope(headers: list[tuple[bytes, bytes]], query: bytes = b"") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/p", "headers": headers, "query_string": query}


async def never() -> Message:
    await asyncio.Event().wait()
    return {}


def test_headers_are_lower_case_and_the_last_repeat_wins() -> None:
    request = HttpRequest.from_scope(scope([(b"X-A", b"1"), (b"x-a", b"2"), (b"Accept", b"\xe9")]), never)
    assert request.headers == {"x-a": "2", "accept": "é"}  # latin-1, as HTTP header bytes


@pytest.mark.parametrize(
    ("query", "parsed"),
    [(b"", {}), (b"a=1", {"a": ["1"]}), (b"a=1&a=2&b=%20x", {"a": ["1", "2"], "b": [" x"]}), (b"flag", {})],
)
def test_query_strings(query: bytes, parsed: dict[str, list[str]]) -> None:
    assert HttpRequest.from_scope(scope([], query), never).query == parsed


def test_a_body_in_parts_and_a_body_cut_by_a_disconnect() -> None:
    async def body_of(messages: list[Message]) -> bytes:
        async def receive() -> Message:
            return messages.pop(0)

        return await HttpRequest.from_scope(scope([]), receive).body()

    parts: list[Message] = [{"type": "http.request", "body": b"ab", "more_body": True},
             {"type": "http.request", "body": b"c", "more_body": False}]
    assert asyncio.run(body_of(parts)) == b"abc"
    cut: list[Message] = [{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"}]
    assert asyncio.run(body_of(cut)) == b""


def test_with_body_replays_a_read_body_then_defers_to_the_client() -> None:
    async def scenario() -> tuple[bytes, Message]:
        async def receive() -> Message:
            return {"type": "http.disconnect"}

        request = HttpRequest.from_scope(scope([]), receive).with_body(b"raw")
        return await request.body(), await request.receive()

    assert asyncio.run(scenario()) == (b"raw", {"type": "http.disconnect"})


def test_run_until_disconnect_reports_whether_the_work_ended() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        gone = asyncio.Event()

        async def receive() -> Message:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def quick() -> None:
            return None

        finished = await run_until_disconnect(receive, quick())
        cancelled = False

        async def forever() -> None:
            nonlocal cancelled
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled = True
                raise

        gone.set()
        ended = await run_until_disconnect(receive, forever())
        return finished, ended, cancelled

    assert asyncio.run(scenario()) == (True, False, True)
