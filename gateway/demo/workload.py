"""The demo's traffic: long per-tenant prefixes that repeat, get pushed out of the GPU, and return."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

MODEL = "sim-model"
PREFIX_TOKENS = 1500  # the simulator's tokenizer is byte-level: one token per byte
USERS = ("ann", "bo", "cy", "di", "ed", "flo")
CONCURRENCY = 4


@dataclass(frozen=True)
class Step:
    tenant: str
    user: str
    prompt: str
    phase: str


@dataclass(frozen=True)
class Sample:
    tenant: str
    phase: str
    pool: str
    status: int
    ttft_s: float | None
    prompt_tokens: int
    cached_tokens: int


def prefix(tenant: str, index: int) -> str:
    words = " ".join(f"{tenant}-doc{index}-w{word}" for word in range(PREFIX_TOKENS // 8))
    return words[:PREFIX_TOKENS]


def plan(tenants: list[str]) -> list[list[Step]]:
    """Rounds run one after another; the steps of a round run concurrently."""
    owned = [(tenant, index, USERS[(position * 2 + index) % len(USERS)])
             for position, tenant in enumerate(tenants) for index in range(2)]
    def ask(phase: str, question: str) -> list[Step]:
        return [Step(tenant, user, f"{prefix(tenant, index)} {question}", phase) for tenant, index, user in owned]
    pressure = [Step(tenant, USERS[n % len(USERS)], prefix(f"{tenant}-noise{n}", n), "pressure")
                for n in range(3) for tenant in tenants]
    return [ask("cold", "Summarise."), ask("repeat", "List the key terms."), pressure,
            ask("return", "What changed?")]


async def run_workload(gateway_url: str, keys: dict[str, str]) -> list[Sample]:
    samples: list[Sample] = []
    limit = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=gateway_url, timeout=120) as client:
        for round_steps in plan(sorted(keys)):
            samples += await asyncio.gather(*(_bounded(limit, client, keys[s.tenant], s) for s in round_steps))
    return samples


async def _bounded(limit: asyncio.Semaphore, client: httpx.AsyncClient, key: str, step: Step) -> Sample:
    async with limit:
        return await send_step(client, key, step)


async def send_step(client: httpx.AsyncClient, key: str, step: Step) -> Sample:
    body = {"model": MODEL, "prompt": step.prompt, "max_tokens": 8, "temperature": 0, "user": step.user,
            "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, object] = {}
    headers = {"Authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as reply:
        async for line in reply.aiter_lines():
            first, usage = _observe(line, started, first, usage)
        return _sample(step, reply, first, usage)


Observed = tuple[float | None, dict[str, object]]


def _observe(line: str, started: float, first: float | None, usage: dict[str, object]) -> Observed:
    if not line.startswith("data: {"):
        return first, usage
    chunk = json.loads(line[6:])
    if first is None and any(choice.get("text") for choice in chunk.get("choices", [])):
        first = time.perf_counter() - started
    return first, chunk.get("usage") or usage


def _sample(step: Step, reply: httpx.Response, ttft: float | None, usage: dict[str, object]) -> Sample:
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    prompt_tokens = usage.get("prompt_tokens", 0)
    return Sample(step.tenant, step.phase, reply.headers.get("x-kvgate-pool", "?"), reply.status_code, ttft,
                  prompt_tokens if isinstance(prompt_tokens, int) else 0, cached if isinstance(cached, int) else 0)
