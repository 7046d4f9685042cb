"""Who is calling and where to: key extraction, lookup, scopes, exact paths and the route table (pure)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.errors import BadRequest, Forbidden
from gateway.http.auth import AuthFailure, authenticate, authorize, check_path, presented_key
from gateway.policy.loader import KeyGrant, PolicySet
from gateway.policy.model import GatewayConfig
from gateway.routes import FORWARDED_KINDS, ROUTES, Kind, Local, RouteSpec, StreamStyle

# sha256("kvg_test-key"), computed with `printf '%s' kvg_test-key | openssl dgst -sha256`.
TEST_KEY = "kvg_test-key"
TEST_KEY_SHA256 = "cd50c5420dbed8a0420295060a4be3d9a9e4ababb7200f664d3f4a22060a2ca6"


def headers(**values: str) -> list[tuple[bytes, bytes]]:
    return [(name.replace("_", "-").encode(), value.encode()) for name, value in values.items()]


def reason(call: object) -> str:
    assert callable(call)
    with pytest.raises(AuthFailure) as raised:
        call()
    assert raised.value.status_code == 401
    return raised.value.reason


@pytest.mark.parametrize("value", ["Bearer k1", "bearer k1", "BEARER   k1  ", "  Bearer k1"])
def test_bearer_key(value: str) -> None:
    assert presented_key(headers(authorization=value)) == "k1"


def test_x_api_key_alone_and_agreeing_with_bearer() -> None:
    assert presented_key(headers(x_api_key=" k2 ")) == "k2"
    assert presented_key(headers(authorization="Bearer k2", x_api_key="k2")) == "k2"
    assert presented_key([(b"x-api-key", b"k3"), (b"accept", b"*/*")]) == "k3"


def test_failure_reasons() -> None:
    assert reason(lambda: presented_key([])) == "missing"
    assert reason(lambda: presented_key(headers(accept="x"))) == "missing"
    assert reason(lambda: presented_key(headers(authorization="Bearer a", x_api_key="b"))) == "conflicting"
    for value in ("Basic abc", "Bearer", "Bearer   ", "Token x", "k1"):
        assert reason(lambda value=value: presented_key(headers(authorization=value))) == "malformed"


def test_failures_are_openai_invalid_api_key_errors() -> None:
    with pytest.raises(AuthFailure) as raised:
        presented_key([])
    assert raised.value.code == "invalid_api_key"


def _policies(*grants: KeyGrant) -> PolicySet:
    gateway = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p"})
    return PolicySet(gateway=gateway, tenants={}, keys={grant.sha256: grant for grant in grants}, version="v")


def _grant(scopes: tuple[str, ...] = ("inference",)) -> KeyGrant:
    return KeyGrant(tenant="acme", sha256=TEST_KEY_SHA256, scopes=frozenset(scopes))  # type: ignore[arg-type]


def test_authenticate_finds_the_grant_by_key_hash() -> None:
    grant = _grant()
    assert authenticate(TEST_KEY, _policies(grant)) is grant
    assert reason(lambda: authenticate("kvg_other", _policies(grant))) == "unknown_key"
    assert reason(lambda: authenticate(TEST_KEY, _policies())) == "unknown_key"


def test_authenticate_checks_the_stored_hash_itself() -> None:
    """A table entry whose grant carries another hash (a corrupted index) is refused."""
    grant = KeyGrant(tenant="acme", sha256="0" * 64, scopes=frozenset({"inference"}))
    policies = _policies(grant)
    policies.keys[TEST_KEY_SHA256] = grant
    assert reason(lambda: authenticate(TEST_KEY, policies)) == "unknown_key"


@pytest.mark.parametrize(
    ("path", "scopes", "allowed"),
    [("/v1/models", ("inference",), True), ("/metrics", ("inference",), False), ("/metrics", ("metrics",), True),
     ("/admin/reload", ("metrics", "inference"), False), ("/admin/reload", ("admin",), True),
     ("/livez", (), True)],
)
def test_authorize_needs_the_route_scope(path: str, scopes: tuple[str, ...], allowed: bool) -> None:
    if allowed:
        authorize(_grant(scopes), ROUTES[path])
    else:
        with pytest.raises(Forbidden):
            authorize(_grant(scopes), ROUTES[path])


@pytest.mark.parametrize(
    "raw",
    [b"/a%2fb", b"/a%2Fb", b"/a%5cb", b"/a%5Cb", b"/a%2eb", b"/a%2Eb", b"/a%00", b"//a", b"/a//b", b"/a\\b",
     b"/a/./b", b"/a/../b", b"/.", b"/..", b"/a/.", b"/a/..", b"./a", b"../a", b"/a b", b"/a\x00", b"/a\x1f",
     b"/a\x7f", b"/a\tb"],
)
def test_ambiguous_raw_paths_are_400(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        check_path(raw)


@pytest.mark.parametrize("raw", [b"/v1/models", b"/a.b", b"/a..b", b"/.well-known", b"/a/b.", b"/a%20b", b"/a~b"])
def test_plain_raw_paths_pass(raw: bytes) -> None:
    check_path(raw)


# The README's route table, written out: path -> (methods, scope, kind, stream style, chat, GenAI operation, local).
C, R = StreamStyle.CHUNKS, StreamStyle.RESPONSES
EXPECTED_ROUTES = {
    "/v1/completions": ({"POST"}, "inference", Kind.GENERATE, C, False, "text_completion", None),
    "/v1/chat/completions": ({"POST"}, "inference", Kind.GENERATE, C, True, "chat", None),
    "/v1/responses": ({"POST"}, "inference", Kind.GENERATE, R, False, "chat", None),
    "/v1/embeddings": ({"POST"}, "inference", Kind.EMBED, None, False, "embeddings", None),
    "/v1/models": ({"GET"}, "inference", Kind.FORWARD, None, False, None, None),
    "/tokenize": ({"POST"}, "inference", Kind.FORWARD, None, False, None, None),
    "/detokenize": ({"POST"}, "inference", Kind.FORWARD, None, False, None, None),
    "/metrics": ({"GET"}, "metrics", Kind.METRICS, None, False, None, Local.METRICS),
    "/admin/policies": ({"GET"}, "admin", Kind.ADMIN, None, False, None, Local.POLICIES),
    "/admin/reload": ({"POST"}, "admin", Kind.ADMIN, None, False, None, Local.RELOAD),
    "/admin/audit": ({"GET"}, "admin", Kind.ADMIN, None, False, None, Local.AUDIT),
    "/admin/shadow": ({"GET"}, "admin", Kind.ADMIN, None, False, None, Local.SHADOW),
    "/admin/canary": ({"POST"}, "admin", Kind.ADMIN, None, False, None, Local.CANARY),
    "/admin/plan": ({"GET"}, "admin", Kind.ADMIN, None, False, None, Local.PLAN),
    "/livez": ({"GET", "HEAD"}, None, Kind.HEALTH, None, False, None, Local.LIVEZ),
    "/readyz": ({"GET", "HEAD"}, None, Kind.HEALTH, None, False, None, Local.READYZ),
}


def test_the_route_table_is_exactly_the_documented_one() -> None:
    assert {path: (set(spec.methods), spec.scope, spec.kind, spec.stream, spec.chat, spec.genai_operation, spec.local)
            for path, spec in ROUTES.items()} == EXPECTED_ROUTES
    assert all(spec.path == path for path, spec in ROUTES.items())


def test_only_generation_embedding_and_plain_routes_are_forwarded() -> None:
    assert {Kind.GENERATE, Kind.EMBED, Kind.FORWARD} == FORWARDED_KINDS


def test_failure_messages_name_what_to_send() -> None:
    messages = {}
    calls: dict[str, Callable[[], object]] = {
        "missing": lambda: presented_key([]),
        "conflicting": lambda: presented_key(headers(authorization="Bearer a", x_api_key="b")),
        "malformed": lambda: presented_key(headers(authorization="Basic a")),
        "unknown_key": lambda: authenticate("kvg_other", _policies()),
    }
    for name, call in calls.items():
        with pytest.raises(AuthFailure) as raised:
            call()
        assert raised.value.reason == name
        messages[name] = (raised.value.message, str(raised.value))
    assert messages == {
        "missing": ("An API key is required: send 'Authorization: Bearer <key>'.",) * 2,
        "conflicting": ("Authorization and x-api-key carry different keys.",) * 2,
        "malformed": ("The Authorization header must be 'Bearer <key>'.",) * 2,
        "unknown_key": ("The API key is not valid.",) * 2,
    }


def test_path_and_scope_messages() -> None:
    with pytest.raises(BadRequest) as bad:
        check_path(b"//x")
    assert bad.value.message == "The request path is ambiguous (encoded separators, dot segments or '//')."
    with pytest.raises(Forbidden) as forbidden:
        authorize(_grant(("inference",)), ROUTES["/admin/audit"])
    assert forbidden.value.message == "This key lacks the 'admin' scope needed for /admin/audit."


def test_non_ascii_key_bytes_are_read_as_latin_1() -> None:
    assert presented_key([(b"x-api-key", "kéy".encode("latin-1"))]) == "kéy"
    assert presented_key([(b"authorization", "Bearer kéy".encode("latin-1"))]) == "kéy"


def test_route_helper_builds_a_spec() -> None:
    from gateway.routes import _route

    assert _route("/x", "GET HEAD", "admin", Kind.ADMIN) == (
        "/x", RouteSpec("/x", frozenset({"GET", "HEAD"}), "admin", Kind.ADMIN))
    assert _route("/y", "POST", None, Kind.GENERATE, stream=R, chat=True, genai_operation="op", local=Local.AUDIT) == (
        "/y", RouteSpec("/y", frozenset({"POST"}), None, Kind.GENERATE, R, True, "op", Local.AUDIT))
