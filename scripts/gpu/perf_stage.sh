#!/usr/bin/env bash
# Stage what scripts/gpu/perf.sh needs on a host without network: kvgate's runtime wheels, the `compare` extra's
# candidates and the Rust vllm-router for CPython 3.12 on x86-64, and Debian's nginx and wrk packages (unpacked there with dpkg -x, not installed).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${STAGE:-$ROOT/.stage}/perf
mkdir -p "$DEST/whl" "$DEST/deb"
REQS=$(mktemp)
trap 'rm -f "$REQS"' EXIT
python3 - "$ROOT/pyproject.toml" >"$REQS" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as handle:
    project = tomllib.load(handle)["project"]
print("\n".join(project["dependencies"]))
print("\n".join(project["optional-dependencies"]["compare"]))  # candidates the benchmarks measure (granian, pyreqwest)
print("vllm-router==0.1.17")
EOF
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_5; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d "$DEST/whl" -r "$REQS"
# wrk and its LuaJIT: the cheap load generator of `workers_scaling --generator wrk`
(cd "$DEST/deb" && apt-get download nginx nginx-common wrk libluajit2-5.1-2 libluajit2-5.1-common)
du -sh "$DEST"/*
