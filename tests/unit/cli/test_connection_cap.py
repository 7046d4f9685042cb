"""`kvgate serve` lowers its open-connection cap to what the descriptor limit leaves once both upstream pools (the
relay's and the shadows', each up to KVGATE_UPSTREAM_CONNECTIONS) and a reserve are counted. Run in a child
interpreter: the check raises the process's own descriptor limit."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json, resource, sys
from gateway.cli.serve import connection_cap
from gateway.settings import Settings
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 3000), min(hard, 3000)))
settings = Settings(max_connections=10_000, upstream_connections=1000, salt_secret="x" * 40)
print(json.dumps({"cap": connection_cap(settings), "fits": connection_cap(Settings(max_connections=100,
      upstream_connections=1000, salt_secret="x" * 40))}))
"""


def test_the_cap_leaves_room_for_both_upstream_pools_and_the_reserve() -> None:
    """Wrong version: only one pool counted (the cap would be 1,744, and at full load the shadows' connections
    would take the descriptors clients need)."""
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found == {"cap": 3000 - 2 * 1000 - 256, "fits": 100}
