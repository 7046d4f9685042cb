"""The last-resort handler: an exception nobody foresaw becomes an OpenAI-shaped 500 with a request id, one
counted `kvgate_internal_errors_total`, and one JSON log line with the error class and the stack.

Every failure a client or a store can cause from outside is answered with its own 4xx/503 (tests/gateway), so
the unforeseen one is planted: the real gateway application, started through its ASGI lifespan, has its shared
SQLite store closed under it (a store used after close, the kind of ordering bug the handler exists for). It runs
in a child interpreter (tests/unit/http/last_resort_child.py) because logging is configured process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.gateway.conftest import UPSTREAM_KEY, UPSTREAM_KEY_ENV, standard_policy


def test_an_unforeseen_failure_is_an_openai_shaped_500_counted_and_logged(tmp_path: Path) -> None:
    policy = standard_policy(tmp_path / "policies", "http://127.0.0.1:9")  # no upstream is contacted
    policy.write()
    child = subprocess.run(
        [sys.executable, "-m", "tests.unit.http.last_resort_child", str(policy.root), str(tmp_path / "state.sqlite3"),
         policy.keys["root"]],
        capture_output=True, text=True, timeout=120, env={**os.environ, UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    answer = json.loads(child.stdout.strip().splitlines()[-1])
    assert answer["status"] == 500
    error = json.loads(answer["body"])["error"]
    assert (error["type"], error["code"]) == ("internal_error", "internal_error")
    assert "SQLite" not in error["message"] and "closed" not in error["message"]  # no internals to the client
    request_id = answer["headers"]["x-request-id"]
    lines = [json.loads(line) for line in child.stderr.splitlines() if line.startswith("{")]
    mine = [line for line in lines if line.get("request_id") == request_id]
    assert len(mine) == 1
    assert (mine[0]["status"], mine[0]["outcome"], mine[0]["error"]) == (500, "internal_error", "RuntimeError")
    assert mine[0]["stack"]
