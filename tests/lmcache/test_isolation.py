"""LMCache pools through a real gateway, in front of a simulator whose LMCache tier ignores `cache_salt`
(like the LMCache/vLLM versions with that defect). One simulator, two pools naming it: `lm` says
`connector: lmcache` (the gateway stamps its tenant tag), `plain` says `connector: offloading` (no tag).
With the tag two tenants never share an entry; without it they do, and the isolation canary says so.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.connectors.lmcache_tags import SKIP_SAVE_KEY, TAG_KEY, derive_tag
from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, Stack, sim_process
from tests.harness import PolicyDir, bearer, expected_salt, new_secret, run_gateway
from tests.procs import ServerProcess, free_port, kvgate_command
from tests.sim.helpers import poll, words

PROMPT_TOKENS = 1024  # four 256-token LMCache chunks (the simulator's tokens are bytes)


@pytest.fixture(scope="module")
def lmcache_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with sim_process(tmp_path_factory.mktemp("sim"), "--lmcache", "--lmcache-ignore-salt") as server:
        yield server


def lmcache_policy(root: Path, sim_url: str) -> PolicyDir:
    canary = {"prefix_tokens": 256, "model": SIM_MODEL}
    pools = {"lm": {"upstreams": [sim_url], "api_key_env": UPSTREAM_KEY_ENV, "connector": "lmcache",
                    "canary": canary},
             "plain": {"upstreams": [sim_url], "api_key_env": UPSTREAM_KEY_ENV, "canary": canary},
             "down": {"upstreams": [f"http://127.0.0.1:{free_port()}"], "connector": "lmcache", "canary": canary}}
    policy = PolicyDir(root, pools)
    for pool in pools:
        policy.add_tenant(f"acme-{pool}", rollout={"pool": pool})
        policy.add_tenant(f"beta-{pool}", rollout={"pool": pool})
    policy.add_tenant("quiet-lm", rollout={"pool": "lm"}, offload={"max_offload_tokens": 0})
    policy.add_tenant("users-lm", rollout={"pool": "lm"}, cache={"isolation": "user"})
    policy.add_tenant("docs-lm", rollout={"pool": "lm"}, offload={"admission": "returning"})
    policy.add_tenant("mirror-plain", rollout={"pool": "plain"}, shadow={"pool": "lm", "sample": 1.0})
    policy.add_tenant("root", scopes=("admin", "metrics"))
    return policy


@pytest.fixture(scope="module")
def stack(lmcache_sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("gateway")
    policy = lmcache_policy(root / "policies", lmcache_sim.url)
    policy.write()
    secret = new_secret()
    with run_gateway(policy.root, root / "gateway.log", secret, {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gateway:
        yield Stack(gateway=gateway, sim=lmcache_sim, policy=policy, secret=secret)


def complete(stack: Stack, tenant: str, prompt: str, **extra: Any) -> httpx.Response:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    with stack.client(tenant) as client:
        return client.post("/v1/completions", json=body)


def cached(stack: Stack, tenant: str, prompt: str, **extra: Any) -> tuple[int, str]:
    reply = complete(stack, tenant, prompt, **extra)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"], reply.headers["x-request-id"]


def sent_params(stack: Stack, request_id: str) -> dict[str, Any]:
    params = stack.sim_request(request_id)["kv_transfer_params"]
    assert isinstance(params, dict), params
    return params


def lmcache_state(stack: Stack) -> dict[str, int]:
    state: dict[str, int] = httpx.get(f"{stack.sim.url}/sim/state", timeout=10).json()["lmcache"]
    return state


def test_with_the_tag_two_tenants_never_share_an_lmcache_entry(stack: Stack) -> None:
    prompt = words(PROMPT_TOKENS)
    first, first_id = cached(stack, "acme-lm", prompt)
    second, second_id = cached(stack, "beta-lm", prompt)
    assert (first, second) == (0, 0)
    sent = [sent_params(stack, first_id), sent_params(stack, second_id)]
    assert sent == [{TAG_KEY: derive_tag(stack.secret.encode(), expected_salt(stack.secret, tenant))}
                    for tenant in ("acme-lm", "beta-lm")]
    assert lmcache_state(stack)["hit_tokens_total"] == 0  # not even a partial chunk crossed


def test_without_the_tag_the_salt_ignoring_tier_serves_one_tenant_from_another(stack: Stack) -> None:
    prompt = words(PROMPT_TOKENS)
    first, first_id = cached(stack, "acme-plain", prompt)
    second, _ = cached(stack, "beta-plain", prompt)
    assert first == 0
    assert second == PROMPT_TOKENS - 1  # everything but the last token, from acme's LMCache entry
    assert not stack.sim_request(first_id)["kv_transfer_params"]


def canary_count(metrics: str, pool: str, result: str) -> float:
    """The counter's value in a /metrics page (tests in this module share one gateway, in any order)."""
    prefix = f'kvgate_isolation_canary_total{{pool="{pool}",result="{result}"}} '
    return next(float(line[len(prefix):]) for line in metrics.splitlines() if line.startswith(prefix))


def test_the_canary_passes_with_the_tag_and_fails_without_it(stack: Stack) -> None:
    headers = bearer(stack.key("root"))
    with httpx.Client(base_url=stack.url, headers=headers, timeout=60) as client:
        before = client.get("/metrics").text
        tagged = client.post("/admin/canary", params={"pool": "lm"}).json()["outcomes"]
        untagged = client.post("/admin/canary", params={"pool": "plain"}).json()["outcomes"]
        metrics = client.get("/metrics").text
        audit = client.get("/admin/audit").json()
    assert [(o["result"], o["cached_tokens_b"], o["external_hits_delta_b"]) for o in tagged] == [("pass", 0, 0.0)]
    assert [o["result"] for o in untagged] == ["fail"]
    assert untagged[0]["cached_tokens_b"] > 0 and untagged[0]["external_hits_delta_b"] > 0
    assert canary_count(metrics, "plain", "fail") == canary_count(before, "plain", "fail") + 1
    assert canary_count(metrics, "lm", "pass") == canary_count(before, "lm", "pass") + 1
    assert audit["isolation_canary"]["plain"]["latest"][0]["result"] == "fail"
    canary_salts = {stack.sim_requests()[-1].get("cache_salt"), stack.sim_requests()[-2].get("cache_salt")}
    tenant_salts = {expected_salt(stack.secret, tenant) for tenant in stack.policy.tenants}
    assert not canary_salts & tenant_salts  # canary identities are never a tenant's


def test_kvgate_canary_exit_status_follows_the_result(stack: Stack) -> None:
    env = {**os.environ, "KVGATE_ADMIN_KEY": stack.key("root")}
    runs = {pool: subprocess.run(kvgate_command("canary", "--url", stack.url, "--pool", pool), env=env,
                                 capture_output=True, text=True, timeout=120, check=False)
            for pool in ("lm", "plain")}
    assert (runs["lm"].returncode, runs["plain"].returncode) == (0, 1), runs
    assert "fail" in runs["plain"].stdout and "pass" in runs["lm"].stdout


def test_client_lmcache_keys_are_refused(stack: Stack) -> None:
    for key in (TAG_KEY, "lmcache.tag.tenant", SKIP_SAVE_KEY):
        reply = complete(stack, "acme-lm", "hello", kv_transfer_params={key: "x"})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == f"kv_transfer_params.{key}"


def test_a_store_cap_of_zero_becomes_skip_save(stack: Stack) -> None:
    before = lmcache_state(stack)["stored_tokens_total"]
    _, request_id = cached(stack, "quiet-lm", words(PROMPT_TOKENS))
    assert sent_params(stack, request_id)[SKIP_SAVE_KEY] is True
    assert lmcache_state(stack)["stored_tokens_total"] == before
    _, stored_id = cached(stack, "acme-lm", words(PROMPT_TOKENS))
    assert SKIP_SAVE_KEY not in sent_params(stack, stored_id)
    assert lmcache_state(stack)["stored_tokens_total"] == before + PROMPT_TOKENS


def test_offload_admission_keeps_a_new_prefix_out_of_lmcache(stack: Stack) -> None:
    """Wrong version: skip_save taken from the request before admission refused its store, so a one-off document
    went into the LMCache tier all the same (admission's max_offload_tokens: 0 is not read by LMCache)."""
    prompt = words(PROMPT_TOKENS, "admission")
    before = lmcache_state(stack)["stored_tokens_total"]
    _, first_id = cached(stack, "docs-lm", prompt)  # new: never seen before
    assert sent_params(stack, first_id)[SKIP_SAVE_KEY] is True
    assert lmcache_state(stack)["stored_tokens_total"] == before
    _, again_id = cached(stack, "docs-lm", prompt)  # returning: the tier may store it now
    assert SKIP_SAVE_KEY not in sent_params(stack, again_id)
    assert lmcache_state(stack)["stored_tokens_total"] > before


def test_per_user_isolation_gives_each_user_a_tag(stack: Stack) -> None:
    prompt = words(PROMPT_TOKENS)
    _, alice_id = cached(stack, "users-lm", prompt, user="alice")
    bob_cached, bob_id = cached(stack, "users-lm", prompt, user="bob")
    tags = [sent_params(stack, rid)[TAG_KEY] for rid in (alice_id, bob_id)]
    assert bob_cached == 0 and tags[0] != tags[1]


def test_policy_check_names_what_lmcache_cannot_enforce(stack: Stack) -> None:
    result = subprocess.run(kvgate_command("policy", "check", str(stack.policy.root)), capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert any("quiet-lm.yaml: offload.allowed_media" in line and "DISK" in line for line in warnings), warnings
    assert not any("acme-plain" in line and "max_offload_tokens" in line for line in warnings)


def test_a_shadow_copy_to_an_lmcache_pool_carries_the_tag_and_the_primary_does_not(stack: Stack) -> None:
    _, request_id = cached(stack, "mirror-plain", words(PROMPT_TOKENS))
    shadow = poll(lambda: [r for r in stack.sim_requests() if r.get("request_id") == f"{request_id}-shadow"],
                  what="the shadow request at the simulator")
    tag = derive_tag(stack.secret.encode(), expected_salt(stack.secret, "mirror-plain"))
    assert shadow[0]["kv_transfer_params"] == {TAG_KEY: tag}
    assert not stack.sim_request(request_id)["kv_transfer_params"]


def test_a_canary_that_cannot_reach_its_upstream_is_an_error_not_a_pass(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, headers=bearer(stack.key("root")), timeout=60) as client:
        before = client.get("/metrics").text
        (outcome,) = client.post("/admin/canary", params={"pool": "down"}).json()["outcomes"]
        metrics = client.get("/metrics").text
        missing = client.post("/admin/canary", params={"pool": "nope"})
    assert (outcome["result"], outcome["cached_tokens_b"]) == ("error", None)
    assert "ClientConnector" in outcome["detail"]
    assert canary_count(metrics, "down", "error") == canary_count(before, "down", "error") + 1
    assert canary_count(metrics, "down", "pass") == canary_count(before, "down", "pass") == 0.0
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "pool"
