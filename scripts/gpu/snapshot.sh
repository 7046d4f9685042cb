#!/usr/bin/env bash
# Freeze the code that runs on the GPU host into .stage/p2/src.tar.gz: the committed tree at HEAD plus the
# working-tree copies of the load-test files (others may be mid-edit elsewhere in the tree; this run must not
# pick that up). REVISION inside says exactly what it is.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STAGE=${STAGE:-$ROOT/.stage}
OVERLAY=()
for path in gateway/cli/loadtest.py gateway/devtools/loadtest loadtests/scenarios loadtests/hotscan scripts/gpu; do
  if [ -e "$ROOT/$path" ]; then OVERLAY+=("$path"); fi   # loadtests/hotscan: the admission runner, where present
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
git -C "$ROOT" archive HEAD | tar -x -C "$TMP"
(cd "$ROOT" && tar -cf - --exclude=__pycache__ "${OVERLAY[@]}") | tar -x -C "$TMP"
OVERLAY_SUM=$(cd "$TMP" && find "${OVERLAY[@]}" -type f | sort | xargs sha256sum | sha256sum | cut -c1-16)
echo "$(git -C "$ROOT" rev-parse HEAD) + working-tree ${OVERLAY[*]} (sha256 ${OVERLAY_SUM})" > "$TMP/REVISION"
mkdir -p "$STAGE/p2"
tar -czf "$STAGE/p2/src.tar.gz" -C "$TMP" .
cat "$TMP/REVISION"; du -b "$STAGE/p2/src.tar.gz"
