"""Runs in a child interpreter for tests/unit/http/test_idle_imports.py: starts the gateway as `kvgate serve`
does (the command line parsed by `gateway.cli.main`, the settings checked and uvicorn's configuration loaded by
`gateway.cli.serve`, the app started through its ASGI lifespan on uvicorn's event loop), and prints one JSON
line: every module loaded once it is up and idle.

    python -m tests.unit.http.idle_imports_child POLICY_DIR [--small-call]

`--small-call` first opens the session of the gateway's own small upstream calls, as the first canary probe,
`/version` probe or plan read does: the control that shows a lazily loaded client becomes visible here.
"""

from __future__ import annotations

import asyncio
import json
import sys

from gateway.cli.main import build_parser, chosen_command
from gateway.http.app import GatewayApp
from gateway.settings import Settings
from tests.unit.http.last_resort_child import Lifespan


async def idle_modules(app: GatewayApp, small_call: bool) -> list[str]:
    lifespan = Lifespan(app)
    task = await lifespan.start()
    try:
        if small_call:
            await app.state.calls.session()
        return sorted(sys.modules)
    finally:
        await lifespan.stop(task)


def main(argv: list[str]) -> int:
    command = ["serve", "--policies", argv[0]]
    args = build_parser(chosen_command(command)).parse_args(command)
    from gateway.cli.serve import checked_settings, serving_config  # imported as `kvgate serve` imports it

    settings = checked_settings({"policies": args.policies})
    if not isinstance(settings, Settings):
        return settings
    app = GatewayApp(settings)
    config = serving_config(app, settings, host="127.0.0.1", port=0)
    config.load()
    loop_factory = config.get_loop_factory()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        modules = runner.run(idle_modules(app, "--small-call" in argv[1:]))
    print(json.dumps(modules))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
