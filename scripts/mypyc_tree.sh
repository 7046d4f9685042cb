#!/usr/bin/env bash
# Build a copy of gateway/ with its request-path modules compiled by mypyc, for `--compare-tree` in
# loadtests/proxy_overhead.py and loadtests/instructions.py. An experiment, not a build of kvgate: the gateway
# ships as Python (docs/proxy-costs.md, "Compiling with mypyc", says why).
#
#   bash scripts/mypyc_tree.sh DEST [PYTHON] [sync]
#
# DEST: the folder to create (its gateway/ and mypyc's runtime library go there; anything in it is replaced).
# PYTHON: an interpreter whose environment has mypy and kvgate's dependencies (default .venv/bin/python). The
#   compiled modules load only into the same CPython minor version: for the device host (3.12), make one with
#   `python3.12 -m venv V && V/bin/pip install -e '.[test]'`.
# sync: compile only the modules without coroutines (SYNC below) instead of the whole set (ALL).
# The commit compiled is HEAD (COMMIT=... to choose another).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:?usage: scripts/mypyc_tree.sh DEST [PYTHON] [sync]}
PYTHON=${2:-$ROOT/.venv/bin/python}
case $PYTHON in /*) ;; */*) PYTHON=$PWD/$PYTHON ;; esac  # the build runs in another folder
SYNC=(gateway/proxy/sse.py gateway/reuse/fingerprint.py gateway/proxy/rewrite.py gateway/proxy/shape.py
      gateway/strict/request_fields.py gateway/reuse/sampling.py gateway/salts.py gateway/proxy/rawprompt.py)
# Left out of ALL: gateway/proxy/features.py and gateway/asgi/inline.py (interpreted classes subclass theirs, or
# they subclass Generic, which mypyc refuses at import) and the uvicorn subclass in gateway/limits/.
ALL=("${SYNC[@]}" gateway/proxy/upstream.py gateway/proxy/forward.py gateway/proxy/misspath.py
     gateway/proxy/record.py gateway/reuse/admission.py gateway/http/auth.py gateway/http/app.py gateway/log.py
     gateway/asgi/body_writer.py gateway/limits/slots.py gateway/reuse/trace.py gateway/reuse/trace_feature.py
     gateway/reuse/feature.py gateway/reuse/shared.py gateway/proxy/balance.py gateway/asgi/io.py
     gateway/asgi/disconnect.py)
if [ "${3:-}" = sync ]; then MODULES=("${SYNC[@]}"); else MODULES=("${ALL[@]}"); fi
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
git -C "$ROOT" archive "${COMMIT:-HEAD}" gateway pyproject.toml | tar -x -C "$BUILD"
# mypyc compiles exception classes as native classes, which cannot also derive from TimeoutError: the upstream
# client's exceptions are marked as ordinary Python classes in the copy.
"$PYTHON" - "$BUILD/gateway/proxy/upstream.py" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
text = text.replace("from __future__ import annotations\n",
                    "from __future__ import annotations\nfrom mypy_extensions import mypyc_attr\n", 1)
for name in ("UpstreamTransportError", "UpstreamReadTimeout", "UpstreamConnectTimeout"):
    text = text.replace(f"\nclass {name}(", f"\n@mypyc_attr(native_class=False)\nclass {name}(", 1)
open(path, "w").write(text)
EOF
(cd "$BUILD" && "$PYTHON" -m mypyc "${MODULES[@]}" > build.log 2>&1) || { tail -20 "$BUILD/build.log" >&2; exit 1; }
find "$BUILD" -maxdepth 1 -name '*__mypyc*.so' -o -path "$BUILD/gateway/*.so" | xargs strip --strip-debug
rm -rf "$DEST"
mkdir -p "$DEST"
cp -r "$BUILD/gateway" "$DEST/"
cp "$BUILD"/*__mypyc*.so "$DEST/"
echo "compiled ${#MODULES[@]} modules into $DEST"
