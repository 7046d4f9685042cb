#!/usr/bin/env bash
# Stage everything the H200 host needs for `scripts/gpu/host.sh`, in two carry folders of < 64 MiB each.
# The host has no network: vLLM 0.25.0 (trimmed), its missing wheels, the dummy model dir, and kvgate's
# own dependencies all travel. Everything it reads is in this folder: vllm-wheels.txt (the wheels vLLM 0.25.0
# needs that the H200 image lacks), vllm-wheels-optional.txt (not staged: the image's copies were new enough),
# model/ (Qwen3-8B-shaped config, generation and tokenizer configs) and build_tokenizer.py (32000-id byte BPE).
#
#   .stage/p1/  vllm-a.tar.xz (the one 76 MB library that only compresses to ~54 MB), model.tar.xz (config + tokenizer)
#   .stage/p2/  vllm-b.tar.xz (the rest of vLLM), vllm-whl/ (vLLM's wheels), gw-whl/ (kvgate's wheels)
#   .stage/p2/src.tar.gz is written separately by scripts/gpu/snapshot.sh, right before a run.
#
# Needs: network to the package registry, python3 with pip, unzip, xz, tar. ~6-8 min on 2 cores (xz).
# Keep .stage out of git (`/.stage/` in .git/info/exclude).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STAGE=${STAGE:-$ROOT/.stage}
HERE=$ROOT/scripts/gpu
PY=${PY:-$ROOT/.venv/bin/python}
# shellcheck source=scripts/gpu/lib.sh
source "$HERE/lib.sh"
mkdir -p "$STAGE"/{dl,build/model,p1,p2/vllm-whl,p2/gw-whl}

# 1. The vLLM wheel, unpacked and trimmed of what a dense bf16 model on Hopper never loads.
WHEEL=$STAGE/dl/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl
[ -f "$WHEEL" ] || fetch "$STAGE/dl" vllm==0.25.0
UNPACKED=$STAGE/build/unpacked
if [ ! -f "$UNPACKED/.trimmed" ]; then
  rm -rf "$UNPACKED" && mkdir -p "$UNPACKED"
  (cd "$UNPACKED" && unzip -q "$WHEEL")
  rm -rf "$UNPACKED"/vllm/vllm-rs "$UNPACKED"/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so \
         "$UNPACKED"/vllm/_moe_C_stable_libtorch.abi3.so "$UNPACKED"/vllm/third_party/fmha_sm100 \
         "$UNPACKED"/vllm/third_party/deep_gemm/include
  find "$UNPACKED"/vllm/third_party/deep_gemm -maxdepth 1 -name '_C.cpython-3*-x86_64-linux-gnu.so' \
       ! -name '_C.cpython-312-*' -delete
  touch "$UNPACKED/.trimmed"
fi

# 2. Two archives: the big compiled-kernel library alone (part 1), everything else (part 2). xz -9e, in parallel.
if [ ! -f "$STAGE/p1/vllm-a.tar.xz" ]; then
  tar -C "$UNPACKED" -cf - vllm/_C_stable_libtorch.abi3.so \
    | xz --lzma2=preset=9e,dict=128MiB -T1 -c > "$STAGE/p1/vllm-a.tar.xz.part" &
  tar -C "$UNPACKED" -cf - --exclude=vllm/_C_stable_libtorch.abi3.so --exclude=.trimmed vllm vllm-0.25.0.dist-info \
    | xz --lzma2=preset=9e,dict=256MiB -T1 -c > "$STAGE/p2/vllm-b.tar.xz.part" &
  wait
  xz -t "$STAGE/p1/vllm-a.tar.xz.part" && xz -t "$STAGE/p2/vllm-b.tar.xz.part"
  mv "$STAGE/p1/vllm-a.tar.xz.part" "$STAGE/p1/vllm-a.tar.xz"
  mv "$STAGE/p2/vllm-b.tar.xz.part" "$STAGE/p2/vllm-b.tar.xz"
fi

# 3. vLLM's wheels that the host image lacks (the recipe's list), and kvgate's own, pinned to this venv.
sed -E 's/^([A-Za-z0-9_.]+)-([0-9][^-]*)-.*$/\1==\2/' "$HERE/vllm-wheels.txt" > "$STAGE/build/vllm-reqs.txt"
[ "$(ls "$STAGE/p2/vllm-whl" | wc -l)" -ge "$(wc -l < "$STAGE/build/vllm-reqs.txt")" ] \
  || fetch "$STAGE/p2/vllm-whl" -r "$STAGE/build/vllm-reqs.txt"
"$PY" "$ROOT/scripts/gpu/gw_requirements.py" --python 3.12 > "$STAGE/build/gw-reqs.txt"
fetch "$STAGE/p2/gw-whl" -r "$STAGE/build/gw-reqs.txt"
# A wheel both sets hold travels once: gw-whl/shared.txt names the ones to take from vllm-whl/ instead.
: > "$STAGE/p2/gw-whl/shared.txt"
for wheel in "$STAGE"/p2/gw-whl/*.whl; do
  name=$(basename "$wheel")
  if [ -f "$STAGE/p2/vllm-whl/$name" ]; then echo "$name" >> "$STAGE/p2/gw-whl/shared.txt"; rm "$wheel"; fi
done

# 4. The dummy model: Qwen3-8B-shaped config, and a 32000-id byte-level BPE tokenizer (build_tokenizer.py).
#    It travels xz-packed (model.tar.xz, ~0.6 MB instead of 2.3 MB): part 1 is the tightest of the transfers.
MODEL=$STAGE/build/model
install -m 644 "$HERE/model/config.json" "$MODEL/config.json"
install -m 644 "$HERE/model/generation_config.json" "$MODEL/generation_config.json"
if [ ! -f "$MODEL/tokenizer.json" ]; then
  [ -x "$STAGE/tokvenv/bin/python" ] || { python3 -m venv "$STAGE/tokvenv" && "$STAGE/tokvenv/bin/pip" install -q tokenizers; }
  "$STAGE/tokvenv/bin/python" "$HERE/build_tokenizer.py" "$MODEL"
fi
rm -rf "$STAGE/p1/model"   # the unpacked form of earlier stagings
tar -C "$MODEL" -cf - . | xz -9 -T1 -c > "$STAGE/p1/model.tar.xz"

du -sh "$STAGE"/p1/* "$STAGE"/p2/*
echo "part 1: $(dir_bytes "$STAGE/p1") bytes; part 2 (before src.tar.gz): $(dir_bytes "$STAGE/p2") bytes"
