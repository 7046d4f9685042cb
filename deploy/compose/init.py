#!/usr/bin/env python3
"""Create the compose project's secrets: run once on the GPU host, before `docker compose up`.

Writes, next to this file (both ignored by git):
  .env                     KVGATE_SALT_SECRET, the two vLLM API keys, the Grafana admin password
  .local/policies/         a copy of ./policies where every `# key: NAME` line carries the hash of a fresh key
  .local/metrics.key       the plain key of `ops-metrics` (metrics scope), read by Prometheus
  .local/keys.txt          every plain key, once; hand them out and delete the file

Only the standard library is used (no kvgate install needed). A key's hash is the hex SHA-256 of the key,
as `kvgate keys hash` prints it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEY_LINE = re.compile(r'^(?P<head>\s*- sha256: )"[0-9a-f]{64}"(?P<tail>\s*# key: (?P<name>[a-z0-9-]+))\s*$')


def new_key() -> str:
    return "kvg_" + secrets.token_urlsafe(32)


def rekey(text: str, keys: dict[str, str]) -> str:
    lines = []
    for line in text.splitlines():
        match = KEY_LINE.match(line)
        if match:
            key = keys.setdefault(match["name"], new_key())
            digest = hashlib.sha256(key.encode()).hexdigest()
            line = f'{match["head"]}"{digest}"{match["tail"]}'
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    path.write_text(text)
    path.chmod(mode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="replace existing secrets (rotates every key)")
    parser.add_argument("--dir", type=Path, default=HERE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root: Path = args.dir
    env_file, local = root / ".env", root / ".local"
    if (env_file.exists() or local.exists()) and not args.force:
        print(f"{env_file} or {local} exists; pass --force to replace them (every key changes)", file=sys.stderr)
        return 1
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(mode=0o700)
    keys: dict[str, str] = {}
    shutil.copytree(root / "policies", local / "policies")
    for path in sorted((local / "policies").rglob("*")):
        if path.suffix == ".yaml":
            path.write_text(rekey(path.read_text(), keys))
        path.chmod(0o755 if path.is_dir() else 0o644)  # read by the kvgate container's own uid
    (local / "policies").chmod(0o755)
    if "ops-metrics" not in keys:
        print("policies/tenants has no `# key: ops-metrics` line for Prometheus", file=sys.stderr)
        return 1
    # Read by Prometheus (another uid) through a bind mount; .local itself stays 0700.
    write_private(local / "metrics.key", keys["ops-metrics"] + "\n", 0o644)
    write_private(local / "keys.txt", "".join(f"{name}\t{key}\n" for name, key in sorted(keys.items())))
    write_private(env_file, "".join(f"{name}={value}\n" for name, value in (
        ("KVGATE_SALT_SECRET", secrets.token_hex(32)),
        ("VLLM_OFFLOAD_KEY", secrets.token_urlsafe(24)),
        ("VLLM_CONTROL_KEY", secrets.token_urlsafe(24)),
        ("GRAFANA_ADMIN_PASSWORD", secrets.token_urlsafe(18)),
    )))
    print(f"wrote {env_file}, {local}/policies, {local}/metrics.key")
    print(f"tenant keys (shown once, also in {local}/keys.txt):")
    for name, key in sorted(keys.items()):
        print(f"  {name:12} {key}")
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
