"""Authentication happens on every path and method before routing; then scopes and exact paths."""

from __future__ import annotations

import httpx
import pytest

from gateway.routes import ROUTES
from tests.gateway.conftest import Stack
from tests.harness import bearer

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD")
# vLLM routes that must never be reachable through the gateway (facts §5).
VLLM_OPERATIONAL = (
    "/sleep", "/wake_up", "/reset_prefix_cache", "/collective_rpc", "/scale_elastic_ep", "/invocations",
    "/health", "/load", "/version", "/ping", "/kv_event_sources", "/pooling", "/score", "/rerank",
    "/v1/messages", "/inference/v1/generate", "/docs", "/openapi.json", "/server_info", "/abort_requests",
)
KNOWN = tuple(ROUTES)
PUBLIC = {"/livez", "/livez?a=1"}  # public paths ignore credentials (and answer 405 to a wrong method)


def path_variants(path: str) -> list[str]:
    """Spellings that some servers would resolve to `path`."""
    parent, _, leaf = path.rpartition("/")
    parent = parent or "/x"
    variants = [path, path + "/", path.upper(), "/" + path, path.replace("/", "//", 1)]
    variants += [f"{parent}%2F{leaf}", f"{parent}%2f{leaf}", f"{parent}/./{leaf}", f"/x/..{path}"]
    variants += [f"{parent}/%2e%2e/{leaf}", path + "%00", path + "?a=1"]
    return variants


MATRIX = sorted({variant for path in (*KNOWN, *VLLM_OPERATIONAL, "/", "/nope") for variant in path_variants(path)})


def send(stack: Stack, method: str, target: str, headers: dict[str, str] | None = None) -> httpx.Response:
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        return request(client, method, target, headers)


def request(client: httpx.Client, method: str, target: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """Send `target` verbatim as the request target, so no client-side normalisation hides a spelling."""
    return client.request(method, "/", headers=headers, extensions={"target": target.encode()})


def statuses(stack: Stack, method: str, headers: dict[str, str] | None = None) -> dict[str, int]:
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        return {target: request(client, method, target, headers).status_code for target in MATRIX
                if target not in PUBLIC}


@pytest.mark.parametrize("method", METHODS)
def test_every_path_and_method_without_key_is_401(stack: Stack, method: str) -> None:
    assert {target: status for target, status in statuses(stack, method).items() if status != 401} == {}


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_wrong_key_is_401_everywhere(stack: Stack, method: str) -> None:
    wrong = bearer("kvg_not-a-real-key")
    assert {target: status for target, status in statuses(stack, method, wrong).items() if status != 401} == {}


def test_401_body_is_openai_shaped(stack: Stack) -> None:
    reply = send(stack, "POST", "/v1/chat/completions")
    assert reply.status_code == 401
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "authentication_error"


def test_public_path_matches_only_exactly(stack: Stack) -> None:
    assert send(stack, "GET", "/livez").status_code == 200
    for variant in ("/livez/", "/LIVEZ", "//livez", "/livez%2F", "/./livez"):
        assert send(stack, "GET", variant).status_code == 401, variant


def test_x_api_key_header_is_accepted(stack: Stack) -> None:
    reply = send(stack, "GET", "/v1/models", {"x-api-key": stack.key("acme")})
    assert reply.status_code == 200


def test_two_different_keys_are_refused(stack: Stack) -> None:
    headers = {**bearer(stack.key("acme")), "x-api-key": stack.key("beta")}
    assert send(stack, "GET", "/v1/models", headers).status_code == 401


def test_malformed_authorization_is_refused(stack: Stack) -> None:
    for value in ("Basic abc", "Bearer", "Token x", stack.key("acme")):
        assert send(stack, "GET", "/v1/models", {"Authorization": value}).status_code == 401, value


@pytest.mark.parametrize("target", ["/v1%2Fmodels", "/v1//models", "/v1/./models", "/x/../v1/models",
                                    "/v1/%2e%2e/metrics", "//v1/models"])
def test_ambiguous_paths_with_a_valid_key_are_400(stack: Stack, target: str) -> None:
    reply = send(stack, "GET", target, bearer(stack.key("acme")))
    assert reply.status_code == 400
    assert "ambiguous" in reply.json()["error"]["message"]


@pytest.mark.parametrize("target", ["/v1/models/", "/V1/MODELS", "/v1/%6dodels", "/nope"])
def test_paths_match_exactly(stack: Stack, target: str) -> None:
    assert send(stack, "GET", target, bearer(stack.key("acme"))).status_code == 404


@pytest.mark.parametrize("path", VLLM_OPERATIONAL)
def test_vllm_operational_routes_are_never_forwarded(stack: Stack, path: str) -> None:
    seen_before = len(stack.sim_requests())
    for method in ("GET", "POST"):
        assert send(stack, method, path, bearer(stack.key("acme"))).status_code == 404
    assert len(stack.sim_requests()) == seen_before


def test_wrong_method_is_405(stack: Stack) -> None:
    assert send(stack, "DELETE", "/v1/models", bearer(stack.key("acme"))).status_code == 405


@pytest.mark.parametrize(
    ("tenant", "path", "allowed"),
    [("acme", "/v1/models", True), ("acme", "/metrics", False), ("acme", "/admin/policies", False),
     ("ops", "/metrics", True), ("ops", "/v1/models", False), ("ops", "/admin/policies", False),
     ("root", "/admin/policies", True), ("root", "/v1/models", False), ("root", "/metrics", False)],
)
def test_scopes(stack: Stack, tenant: str, path: str, allowed: bool) -> None:
    status = send(stack, "GET", path, bearer(stack.key(tenant))).status_code
    assert status == (200 if allowed else 403)


def _auth_failures(stack: Stack) -> dict[str, float]:
    text = send(stack, "GET", "/metrics", bearer(stack.key("ops"))).text
    prefix = 'kvgate_auth_failures_total{reason="'
    return {line[len(prefix):].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


def test_auth_failures_are_counted_by_reason(stack: Stack) -> None:
    """Each reason is caused here, once, and must rise by exactly one (no reliance on earlier tests)."""
    causes = {
        "missing": {},
        "unknown_key": bearer("kvg_not-a-real-key"),
        "malformed": {"Authorization": "Basic x"},
        "conflicting": {**bearer(stack.key("acme")), "x-api-key": stack.key("beta")},
        "scope": bearer(stack.key("acme")),
    }
    for reason, headers in causes.items():
        before = _auth_failures(stack).get(reason, 0.0)
        path = "/metrics" if reason == "scope" else "/v1/models"
        assert send(stack, "GET", path, headers).status_code == (403 if reason == "scope" else 401)
        assert _auth_failures(stack).get(reason, 0.0) == before + 1, reason


def test_admin_policies_shows_no_key_material(stack: Stack) -> None:
    reply = send(stack, "GET", "/admin/policies", bearer(stack.key("root")))
    assert reply.status_code == 200
    text = reply.text
    assert set(reply.json()["tenants"]) == set(stack.policy.tenants)
    for tenant, key in stack.policy.keys.items():
        assert key not in text
        assert stack.policy.tenants[tenant]["keys"][0]["sha256"] not in text
    assert stack.secret not in text
