"""Counts the page faults of a pattern a large request leaves behind: three 1 MiB copies made and freed, twenty
times over. Run bare (`bare`), or after the real gateway application's ASGI lifespan has started (`served`), which
is where `kvgate serve` applies gateway.http.process.keep_freed_memory. A child interpreter, because the C
allocator's settings are process-wide. Prints one JSON line: the minor page faults of the twenty rounds."""

from __future__ import annotations

import asyncio
import json
import resource
import sys
from pathlib import Path

from pydantic import SecretStr

from gateway.http.app import GatewayApp
from gateway.log import configure_logging
from gateway.settings import Settings
from tests.salt_vectors import GATEWAY_SECRET
from tests.unit.http.last_resort_child import Lifespan

COPY_BYTES = 1024 * 1024
COPIES = 3
ROUNDS = 20


def copies_made_and_freed() -> None:
    copies = [bytearray(COPY_BYTES) for _ in range(COPIES)]  # zero-filled: every page is touched
    del copies


def faults_of_rounds() -> int:
    for _ in range(3):  # glibc's own thresholds adapt to the first large frees: counted after them
        copies_made_and_freed()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(ROUNDS):
        copies_made_and_freed()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


async def served_faults(app: GatewayApp) -> int:
    lifespan = Lifespan(app)
    task = await lifespan.start()
    try:
        return faults_of_rounds()
    finally:
        await lifespan.stop(task)


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "bare":
        faults = faults_of_rounds()
    else:
        root, state = Path(argv[1]), Path(argv[2])
        configure_logging("json", "warning")
        settings = Settings(policies=root, salt_secret=SecretStr(GATEWAY_SECRET), state_path=state, reuse_trace=False)
        faults = asyncio.run(served_faults(GatewayApp(settings)))
    print(json.dumps({"faults": faults}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
