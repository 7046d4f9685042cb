"""A real gateway process in front of the real vLLM server: auth, forwarding, salts, isolation, metrics.

One gateway serves this module, with one pool (the session's vLLM, reached with the upstream key from
``api_key_env``) and two tenants: ``alpha`` rejects client-sent salts, ``beta`` has them replaced.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types import CompletionUsage
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess
from tests.realvllm.kv_events import KvEvent, KvEventWatcher
from tests.realvllm.prompts import long_prompt, short_prompt
from tests.realvllm.tooling.vllm_server import RunningVllm
from tests.salt_vectors import known_salt

pytestmark = pytest.mark.realvllm

POOL = "vllm"
UPSTREAM_KEY_VARIABLE = "UPSTREAM_TEST_REAL_VLLM_KEY"
ALPHA_EPOCH = 3  # not the default, so a derivation that ignores the epoch is caught
MAX_TOKENS = 8


@dataclass(frozen=True)
class GatewayUnderTest:
    server: ServerProcess
    secret: str
    model: str
    alpha_key: str
    beta_key: str
    gamma_key: str
    metrics_key: str
    admin_key: str

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, key: str) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60.0)


def policy_for(real_vllm: RunningVllm, root: Path) -> tuple[PolicyDir, str]:
    pools = {
        POOL: {
            "upstreams": [real_vllm.url],
            "api_key_env": UPSTREAM_KEY_VARIABLE,
            # The replay endpoint is the PUB port plus one, the gateway's default.
            "kv_events": [real_vllm.kv_events_endpoint],
        }
    }
    policies = PolicyDir(root, pools)
    policies.add_tenant("alpha", cache={"isolation": "tenant", "salt_epoch": ALPHA_EPOCH, "client_salt": "reject"})
    policies.add_tenant("beta", cache={"isolation": "tenant", "salt_epoch": 1, "client_salt": "replace"})
    policies.add_tenant("gamma", cache={"isolation": "user", "salt_epoch": 1})
    metrics_key = policies.add_key("alpha", ("metrics", "admin"))
    return policies, metrics_key


@pytest.fixture(scope="module")
def gateway(real_vllm: RunningVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayUnderTest]:
    work_dir = tmp_path_factory.mktemp("gateway-realvllm")
    policies, metrics_key = policy_for(real_vllm, work_dir / "policies")
    policies.write()
    secret = new_secret()
    env = {UPSTREAM_KEY_VARIABLE: real_vllm.api_key, "KVGATE_STATE_PATH": str(work_dir / "state.sqlite3")}
    with run_gateway(policies.root, work_dir / "gateway.log", secret, env=env) as server:
        yield GatewayUnderTest(
            server=server,
            secret=secret,
            model=real_vllm.model_name,
            alpha_key=policies.keys["alpha"],
            beta_key=policies.keys["beta"],
            gamma_key=policies.keys["gamma"],
            metrics_key=metrics_key,
            admin_key=metrics_key,
        )


def contract_salt(secret: str, tenant: str, epoch: int) -> str:
    """Contract §2, computed here rather than through the gateway's own code."""
    return hmac.new(secret.encode(), f"{tenant}:{epoch}".encode(), hashlib.sha256).hexdigest()


def is_root_stored_with(salt: str) -> Callable[[KvEvent], bool]:
    def matches(event: KvEvent) -> bool:
        return event.kind == "BlockStored" and event.salts()[:1] == [salt]

    return matches


def root_salts_since(events: list[KvEvent], start: int) -> set[str | None]:
    return {event.salts()[0] for event in events[start:] if event.kind == "BlockStored" and event.block_hashes}


def cached_tokens(client: OpenAI, model: str, prompt: str) -> int:
    completion = client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert completion.usage is not None
    details = completion.usage.prompt_tokens_details
    assert details is not None
    assert details.cached_tokens is not None
    return details.cached_tokens


def cached_prompt_tokens_metric(gateway: GatewayUnderTest, tenant: str) -> float:
    reply = httpx.get(f"{gateway.url}/metrics", headers=bearer(gateway.metrics_key))
    assert reply.status_code == 200, reply.text
    return sum(
        sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
        if sample.name == "kvgate_cached_prompt_tokens_total" and sample.labels.get("tenant") == tenant
    )


INFERENCE_ROUTES = (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"))
# Open on vLLM itself (no key needed there); the gateway must guard them like everything else.
VLLM_OPEN_ROUTES = (("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/invocations"), ("GET", "/health"))


@pytest.mark.parametrize(("method", "path"), INFERENCE_ROUTES + VLLM_OPEN_ROUTES)
def test_requests_without_a_valid_key_get_401(gateway: GatewayUnderTest, method: str, path: str) -> None:
    body = {"model": gateway.model, "prompt": "hi", "max_tokens": 1}
    for headers in ({}, bearer("kvg_not-a-key-" + uuid.uuid4().hex)):
        reply = httpx.request(method, f"{gateway.url}{path}", headers=headers, json=body)
        assert reply.status_code == 401, (path, reply.text)
        assert "error" in reply.json()


@pytest.mark.parametrize("path", ["/invocations", "/health"])
def test_vllm_operational_routes_are_not_forwarded(gateway: GatewayUnderTest, path: str) -> None:
    body = {"model": gateway.model, "prompt": "hi", "max_tokens": 1}
    reply = httpx.request(
        "POST" if path == "/invocations" else "GET",
        f"{gateway.url}{path}",
        headers=bearer(gateway.alpha_key),
        json=body,
    )
    assert reply.status_code == 404, reply.text


def test_gateway_metrics_are_its_own(gateway: GatewayUnderTest) -> None:
    reply = httpx.get(f"{gateway.url}/metrics", headers=bearer(gateway.metrics_key))
    assert reply.status_code == 200
    assert "kvgate_requests_total" in reply.text
    assert "vllm:" not in reply.text


def assert_relayed_headers(headers: httpx.Headers) -> None:
    """The gateway's own headers on an answer it relayed: a request id and the pool it chose."""
    assert headers.get("x-request-id")
    assert headers.get("x-kvgate-pool") == POOL


def streamed_usage(usages: Iterable[CompletionUsage | None], include_usage: bool) -> list[CompletionUsage]:
    """The usage a stream carried, checked: one usage chunk when the client asked for it, none otherwise (the
    gateway may ask vLLM for usage to count tokens, but must not hand it to a client that did not)."""
    reported = [usage for usage in usages if usage is not None]
    assert len(reported) == (1 if include_usage else 0)
    return reported


def test_non_streaming_completion_and_chat(gateway: GatewayUnderTest) -> None:
    with gateway.client(gateway.alpha_key) as client:
        raw = client.completions.with_raw_response.create(
            model=gateway.model, prompt=short_prompt(), max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
        )
        completion = raw.parse()
        chat = client.chat.completions.create(
            model=gateway.model,
            messages=[{"role": "user", "content": short_prompt()}],
            max_tokens=MAX_TOKENS,
            extra_body={"ignore_eos": True},
        )

    assert_relayed_headers(raw.headers)
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.completion_tokens == MAX_TOKENS
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content
    assert chat.usage is not None
    assert chat.usage.completion_tokens == MAX_TOKENS


@pytest.mark.parametrize("include_usage", [False, True])
def test_streaming_completion(gateway: GatewayUnderTest, include_usage: bool) -> None:
    with gateway.client(gateway.alpha_key) as client:
        raw = client.completions.with_raw_response.create(
            model=gateway.model,
            prompt=short_prompt(),
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True} if include_usage else None,
            extra_body={"ignore_eos": True},
        )
        chunks = list(raw.parse())

    assert_relayed_headers(raw.headers)
    assert "".join(choice.text for chunk in chunks for choice in chunk.choices)
    reported = streamed_usage((chunk.usage for chunk in chunks), include_usage)
    if include_usage:
        assert reported[0].completion_tokens == MAX_TOKENS


@pytest.mark.parametrize("include_usage", [False, True])
def test_streaming_chat(gateway: GatewayUnderTest, include_usage: bool) -> None:
    with gateway.client(gateway.alpha_key) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=gateway.model,
            messages=[{"role": "user", "content": short_prompt()}],
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True} if include_usage else None,
            extra_body={"ignore_eos": True},
        )
        chunks = list(raw.parse())

    assert_relayed_headers(raw.headers)
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert deltas[0].role == "assistant"
    assert "".join(delta.content or "" for delta in deltas)
    streamed_usage((chunk.usage for chunk in chunks), include_usage)


def test_tenants_share_no_cached_prefix(gateway: GatewayUnderTest) -> None:
    prompt = long_prompt()
    metric_before = cached_prompt_tokens_metric(gateway, "alpha")
    with gateway.client(gateway.alpha_key) as alpha, gateway.client(gateway.beta_key) as beta:
        alpha_first = cached_tokens(alpha, gateway.model, prompt)
        alpha_repeat = cached_tokens(alpha, gateway.model, prompt)
        beta_same_prompt = cached_tokens(beta, gateway.model, prompt)

    assert alpha_first == 0
    assert alpha_repeat > 0
    assert beta_same_prompt == 0
    # The counter is updated as the response completes; poll it (the deadline bounds the wait only).
    deadline = time.monotonic() + 60.0
    while cached_prompt_tokens_metric(gateway, "alpha") < metric_before + alpha_repeat:
        assert time.monotonic() < deadline, "kvgate_cached_prompt_tokens_total{tenant=alpha} did not rise"
        time.sleep(0.05)


def test_vllm_receives_the_gateway_derived_salt(gateway: GatewayUnderTest, kv_events: KvEventWatcher) -> None:
    salt = contract_salt(gateway.secret, "alpha", ALPHA_EPOCH)
    seen_before = kv_events.drain()  # only events of this request may satisfy the check
    with gateway.client(gateway.alpha_key) as client:
        client.completions.create(model=gateway.model, prompt=long_prompt(items=40), max_tokens=1)

    kv_events.wait_for(is_root_stored_with(salt), since=seen_before)


def test_a_client_salt_is_rejected_for_a_rejecting_tenant(gateway: GatewayUnderTest) -> None:
    with gateway.client(gateway.alpha_key) as client, pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(
            model=gateway.model,
            prompt=short_prompt(),
            max_tokens=1,
            extra_body={"cache_salt": "client-chosen"},
        )
    assert raised.value.status_code == 400
    error = raised.value.body
    assert isinstance(error, dict)
    assert error.get("param") == "cache_salt"


def test_a_client_salt_is_replaced_for_a_replacing_tenant(gateway: GatewayUnderTest, kv_events: KvEventWatcher) -> None:
    client_salt = f"client-chosen-{uuid.uuid4().hex}"
    derived = contract_salt(gateway.secret, "beta", 1)
    seen_before = kv_events.drain()  # earlier beta requests' events stay before this mark
    with gateway.client(gateway.beta_key) as client:
        client.completions.create(
            model=gateway.model,
            prompt=long_prompt(items=40),
            max_tokens=1,
            extra_body={"cache_salt": client_salt},
        )

    kv_events.wait_for(is_root_stored_with(derived), since=seen_before)
    reached_vllm = client_salt in root_salts_since(kv_events.events, seen_before)
    assert not reached_vllm, "the client's cache_salt reached vLLM"


def test_a_per_user_salt_reaches_vllm_and_its_blocks_the_ledger(
    gateway: GatewayUnderTest, kv_events: KvEventWatcher
) -> None:
    """The `tenant:epoch:user` form end to end: the literal known-answer salt (tests/salt_vectors.py) is the
    root salt vLLM reports, and the served ledger attributes those blocks to the user-isolated tenant."""
    salt = known_salt(gateway.secret, "gamma", 1, "carol")
    before = gpu_blocks_stored(gateway).get("gamma", 0)
    seen_before = kv_events.drain()
    with gateway.client(gateway.gamma_key) as client:
        client.completions.create(model=gateway.model, prompt=long_prompt(items=40), max_tokens=1, user="carol")

    kv_events.wait_for(is_root_stored_with(salt), since=seen_before)
    deadline = time.monotonic() + 60
    while gpu_blocks_stored(gateway).get("gamma", 0) <= before:
        assert time.monotonic() < deadline, "the ledger never attributed gamma's blocks"
        time.sleep(0.1)  # polling the audit until the engine's events have been ingested


def gpu_blocks_stored(gateway: GatewayUnderTest) -> dict[str, int]:
    reply = httpx.get(f"{gateway.url}/admin/audit", headers=bearer(gateway.admin_key), timeout=30)
    assert reply.status_code == 200, reply.text
    tenants = reply.json()["tenants"]
    return {tenant: media.get("GPU", {}).get("stored", 0) for tenant, media in tenants.items()}


def test_real_kv_events_are_attributed_per_tenant_by_salt(gateway: GatewayUnderTest) -> None:
    before = gpu_blocks_stored(gateway)
    with gateway.client(gateway.alpha_key) as alpha, gateway.client(gateway.beta_key) as beta:
        alpha.completions.create(model=gateway.model, prompt=long_prompt(), max_tokens=1)
        alpha.completions.create(model=gateway.model, prompt=long_prompt(), max_tokens=1)
        beta.completions.create(model=gateway.model, prompt=long_prompt(), max_tokens=1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = gpu_blocks_stored(gateway)
        if all(after.get(tenant, 0) > before.get(tenant, 0) for tenant in ("alpha", "beta")):
            break
        time.sleep(0.1)  # polling the audit until the engine's events have been ingested
    # Two ~1000-token prompts of alpha, one of beta, 32-token blocks: each stores whole blocks of its own.
    assert after["alpha"] - before.get("alpha", 0) >= 2 * 28
    assert after["beta"] - before.get("beta", 0) >= 28
