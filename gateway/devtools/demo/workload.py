"""The demo's traffic: long per-tenant prefixes that repeat, get pushed out of the GPU cache by other
traffic, and return. The offload pool can serve a returning prefix from its CPU tier; control cannot."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from gateway.proxy.rollout import draw_percent

MODEL = "sim-model"
PREFIX_TOKENS = 1500  # the simulator's tokenizer is byte-level: one token per byte
CONCURRENCY = 1  # one request at a time, so queueing never blurs the A/B
RETURNS = 3
SPLIT_TENANT = "initech"  # the tenant on a 50 % rollout


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


def prefix(owner: str, index: int) -> str:
    words = " ".join(f"{owner}-doc{index}-w{word}" for word in range(PREFIX_TOKENS // 8))
    return words[:PREFIX_TOKENS]


def users_for(tenant: str, count: int, percent: float = 50.0) -> list[str]:
    """Users of `tenant`, half drawn into the rollout's target pool and half not, so both arms get traffic."""
    inside = [f"user{n}" for n in range(200) if draw_percent(f"user:{tenant}:user{n}") < percent]
    outside = [f"user{n}" for n in range(200) if draw_percent(f"user:{tenant}:user{n}") >= percent]
    return [user for pair in zip(inside, outside, strict=False) for user in pair][:count]


def owned_prefixes(tenants: list[str]) -> list[tuple[str, str, int]]:
    """(tenant, user, prefix index): the split tenant has more, so its A/B has enough pairs."""
    owned = []
    for tenant in tenants:
        count = 6 if tenant == SPLIT_TENANT else 2
        owned += [(tenant, user, index) for index, user in enumerate(users_for(tenant, count))]
    return owned


def plan(tenants: list[str]) -> list[list[Step]]:
    """Rounds run one after another; the steps of a round run concurrently."""
    owned = owned_prefixes(tenants)

    def ask(phase: str, question: str) -> list[Step]:
        return [Step(t, user, f"{prefix(t, index)} {question}", phase) for t, user, index in owned]

    def pressure(round_no: int) -> list[Step]:
        return [Step(t, user, prefix(f"{t}-noise{round_no}-{index}", index), "pressure") for t, user, index in owned]

    rounds = [ask("cold", "Summarise."), ask("repeat", "List the key terms.")]
    for round_no in range(RETURNS):
        rounds += [pressure(round_no), ask("return", f"What changed, take {round_no}?")]
    return rounds


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
