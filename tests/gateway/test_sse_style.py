"""A real gateway in front of an upstream that writes another JSON and SSE style than vLLM's
(tests/styled_upstream.py: spaces after `:` and `,`, reversed keys, an escaped `usage` key, CRLF, `data:`
without its space): TTFT, usage and cached tokens are still recorded, the usage chunk the client did not ask
for is still removed, and a `measure_ttft` tenant still gets an assembled reply."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess, upstream_module
from tests.sim.helpers import poll


@pytest.fixture(scope="module")
def styled_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, PolicyDir]]:
    root = tmp_path_factory.mktemp("styled")
    with upstream_module("tests.styled_upstream", root / "upstream.log") as upstream:
        policy = PolicyDir(root / "policies", {"styled": {"upstreams": [upstream.url]}})
        policy.add_tenant("acme")
        policy.add_tenant("retrying", offload={"miss_path": "retry"})  # held until its first content
        policy.add_tenant("delta", measure_ttft=True)
        policy.add_tenant("ops", scopes=("metrics",))
        policy.write()
        with run_gateway(policy.root, root / "gateway.log", new_secret()) as gateway:
            yield gateway, policy


def post(gateway: ServerProcess, policy: PolicyDir, tenant: str, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, headers=bearer(policy.keys[tenant]), timeout=30)


def metric(gateway: ServerProcess, policy: PolicyDir, line_start: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers=bearer(policy.keys["ops"]), timeout=10).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


@pytest.mark.parametrize("tenant", ["acme", "retrying"])
@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "stream": True}),
])
def test_other_styles_keep_ttft_usage_and_stripping(styled_gateway: tuple[ServerProcess, PolicyDir], path: str,
                                                    body: dict[str, object], tenant: str) -> None:
    gateway, policy = styled_gateway
    ttft = f'kvgate_ttft_seconds_count{{pool="styled",route="{path}",tenant="{tenant}"}}'
    tokens = f'kvgate_prompt_tokens_total{{pool="styled",tenant="{tenant}"}}'
    ttft_before = metric(gateway, policy, ttft)
    tokens_before = metric(gateway, policy, tokens)
    reply = post(gateway, policy, tenant, path, body)
    assert reply.status_code == 200
    chunks = [json.loads(line[5:]) for line in reply.text.splitlines()
              if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    assert chunks and all(chunk.get("choices") for chunk in chunks), "the usage chunk reached the client"
    assert "".join(chunk["choices"][0].get("text") or chunk["choices"][0].get("delta", {}).get("content") or ""
                   for chunk in chunks), "no content reached the client"
    poll(lambda: metric(gateway, policy, ttft) == ttft_before + 1 or None, what="a TTFT observation")
    poll(lambda: metric(gateway, policy, tokens) > tokens_before or None, what="prompt tokens from usage")


def test_other_styles_assemble_for_measure_ttft(styled_gateway: tuple[ServerProcess, PolicyDir]) -> None:
    gateway, policy = styled_gateway
    reply = post(gateway, policy, "delta", "/v1/chat/completions",
                 {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200
    body = reply.json()
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["prompt_tokens"] > 0
    ttft = 'kvgate_ttft_seconds_count{pool="styled",route="/v1/chat/completions",tenant="delta"}'
    poll(lambda: metric(gateway, policy, ttft) == 1 or None, what="a TTFT observation")
