#!/usr/bin/env bash
# Download LMCache 0.5.6 and the wheels it needs on the H200 host (cp312, CUDA 13) into .stage/lmcache (ignored):
#   .stage/lmcache/whl/            scripts/gpu/lmcache-0.5.6-wheels.txt (exact pins, no dependency resolution):
#                                  lmcache, numpy, protobuf and the small pure-Python ones (~35 MB)
#   .stage/lmcache/whl-cuda/       the CUDA 13 Python bindings and the compiled helpers (~22 MB): cuda-python,
#                                  cuda-bindings, cuda-core, cuda-pathfinder, cryptography, cffi, pycparser, nvtx
#   .stage/lmcache/whl-mp/         MP=1: scripts/gpu/lmcache-0.5.6-mp-wheels.txt, the OpenTelemetry Prometheus
#                                  exporter an LMCache server needs for its /metrics (the multi-process phase)
#   .stage/lmcache/cupy-a/, cupy-b/  cupy-cuda13x 14.2.0 (69.4 MB) cut in two, for two carry calls in a row;
#                                  cupy-b/ also holds the whole wheel's sha256 for the host to check the join
# One carry call holds < 64 MiB including the repository tree (~7 MB), so the 126 MB need three calls:
#   cupy-a | cupy-b + whl-cuda | whl   (skip the cupy calls and whl-cuda when `lmcache_host.sh probe` shows the
#   image has cupy-cuda13x 14.x and cuda-bindings 13.x already)
# How the list was made: lmcache 0.5.6's Requires-Dist, narrowed to what its in-process and multi-process vLLM
# connectors import at module level (a walk over the wheel's sources), minus what the H200 image or vLLM's own
# wheel set already has; then resolved for cp312 manylinux x86_64 with `pip install --dry-run --report`.
# numpy <= 2.2.6 and protobuf < 7 (lmcache's pins; the image has 2.5.2 and 7.36.2) go into LMCache's own target
# dir, first on the LMCache server's PYTHONPATH only (scripts/gpu/lmcache_host.sh). Same layout as the GPU
# helper's lmcache_stage.sh, so lmcache_host.sh takes either.
# Needs network to the package registry and python3 with pip. About 125 MB in all.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STAGE=${STAGE:-$ROOT/.stage}
HERE=$ROOT/scripts/gpu
PY=${PY:-python3}
PART_BYTES=${PART_BYTES:-40000000}
# shellcheck source=scripts/gpu/lib.sh
source "$HERE/lib.sh"
L=$STAGE/lmcache
mkdir -p "$L/whl" "$L/whl-cuda" "$L/dl" "$L/cupy-a" "$L/cupy-b"
fetch "$L/whl" -r "$HERE/lmcache-0.5.6-wheels.txt"
for name in cuda_python cuda_bindings cuda_core cuda_pathfinder cryptography cffi pycparser nvtx; do
  mv "$L"/whl/"$name"-*.whl "$L/whl-cuda/" 2>/dev/null || true
done
if [ -n "${MP:-}" ]; then mkdir -p "$L/whl-mp" && fetch "$L/whl-mp" -r "$HERE/lmcache-0.5.6-mp-wheels.txt"; fi
fetch "$L/dl" cupy-cuda13x==14.2.0
wheel=$(ls "$L"/dl/cupy_cuda13x-*.whl | head -1)
split_wheel "$wheel" "$PART_BYTES" "$L/cupy-a" "$L/cupy-b"
print_dir_sizes "$L" whl whl-cuda whl-mp cupy-a cupy-b
