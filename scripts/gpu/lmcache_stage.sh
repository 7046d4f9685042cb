#!/usr/bin/env bash
# Stage LMCache 0.5.6 for `scripts/gpu/host.sh lmcache` (issue 16), next to the vLLM staging of stage.sh:
#   .stage/lmcache/whl/     lmcache-wheels.txt: lmcache and what its in-process connector imports that the H200 image
#                           lacks or pins differently (numpy 2.2.6 and protobuf 6.x go to their own site dir, first
#                           on PYTHONPATH for the LMCache vLLM server only; the image keeps numpy 2.5.2, protobuf 7)
#   .stage/lmcache/extra/   EXTRA=1: the rest of lmcache's Requires-Dist that the image lacks (remote/disk backends,
#                           MP-mode observability; nothing the in-process CPU tier imports). Not carried by default.
#   .stage/lmcache/cupy-a/, cupy-b/   CUPY=1: cupy-cuda13x, split in two (< 40 MiB each) for two calls in a row.
#                           The image already has cupy-cuda13x 14.2.0 (the version lmcache resolves to today), so
#                           this is the fallback for a host whose probe (lmcache-probe.txt) shows cupy missing.
# Which imports the in-process connector needs was read from the wheel: a walk over the module-level imports of
# lmcache.integration.vllm.vllm_v1_adapter and lmcache_connector_v1 (cupy only appears in the MP-mode modules).
#   .stage/lmcache/src/    lmcache's source (its sdist, trimmed) and the build tools it pins, for `host.sh lmcache-build`
#                           to rebuild the extensions against the host's torch when the wheel's do not load.
# Needs network to the package registry and python3 with pip. Seconds, not minutes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/gpu
STAGE=${STAGE:-$ROOT/.stage}
PY=${PY:-python3}
CUPY_SPEC=${CUPY_SPEC:-cupy-cuda13x==14.2.0}
# One call carries the repository tree (~7 MB) plus its carry paths, < 64 MiB (67.1 MB) in all. The split puts
# 55 MB in the first call (cupy-a) and the remaining 14.4 MB with whl/ (42.8 MB) in the second.
PART_BYTES=${PART_BYTES:-55000000}
# shellcheck source=scripts/gpu/lib.sh
source "$HERE/lib.sh"
L=$STAGE/lmcache
mkdir -p "$L/whl"
fetch "$L/whl" -r "$HERE/lmcache-wheels.txt"
if [ -n "${EXTRA:-}" ]; then mkdir -p "$L/extra" && fetch "$L/extra" -r "$HERE/lmcache-wheels-extra.txt"; fi
if [ -n "${CUPY:-}" ]; then
  mkdir -p "$L/dl" "$L/cupy-a" "$L/cupy-b"
  fetch "$L/dl" "$CUPY_SPEC"
  wheel=$(ls "$L"/dl/cupy_cuda13x-*.whl | head -1)
  split_wheel "$wheel" "$PART_BYTES" "$L/cupy-a" "$L/cupy-b"
fi
# 4. lmcache's own source, to rebuild its four torch extensions on the host if the wheel's do not load there:
#    the 0.5.6 wheels are built against torch 2.13.0 (its pyproject's build pin); the H200 image has 2.11.0.
#    pip unpacks the sdist before it fails to prepare its metadata here (no torch): --no-clean keeps that tree.
if [ -n "${SRC-1}" ]; then
  mkdir -p "$L/src/tools"
  TMP=$(mktemp -d)
  TMPDIR=$TMP "$PY" -m pip download -q --no-clean --no-deps --no-build-isolation --no-binary lmcache \
    "$(head -1 "$HERE/lmcache-wheels.txt")" -d "$TMP/dl" > "$TMP/log" 2>&1 || true
  SDIST=$(ls -d "$TMP"/pip-download-*/lmcache_* | head -1)
  [ -f "$SDIST/setup.py" ] || { tail -5 "$TMP/log"; echo "no lmcache source tree" >&2; exit 1; }
  grep -o 'torch==[0-9.]*' "$SDIST/pyproject.toml" | head -1 > "$L/src/built-against.txt"
  tar -czf "$L/src/lmcache-src.tar.gz" -C "$SDIST" --exclude=docs --exclude=benchmarks --exclude=examples \
    --exclude=tests --exclude=asset --exclude=operator --exclude=docker .
  rm -rf "$TMP"
  fetch "$L/src/tools" -r "$HERE/lmcache-build-wheels.txt"   # setuptools < 81 and setuptools_scm, as its build pins
fi
find "$L" -name '*.whl' -o -name '*.part-?' -o -name '*.tar.gz' | sort | xargs du -b
print_dir_sizes "$L" whl src extra cupy-a cupy-b
TREE=$(git -C "$ROOT" ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
echo "tree (tracked files here): $TREE bytes; each call must stay under 67108864 bytes with its carry paths"
