# shellcheck shell=bash
# Sourced by the dev-box staging scripts (stage.sh, lmcache_stage.sh, lmcache_wheels.sh): how they fetch wheels
# for the offline H200 host (CPython 3.12, x86-64 manylinux), cut a wheel too large for one carry call in two, and
# measure what a call will carry. The caller sets PY (the python whose pip downloads) before calling fetch.

# Every manylinux tag the host's pip accepts, so pip may take any of the wheels a project publishes for it.
PLATFORMS=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
           manylinux_2_34 manylinux_2_35 manylinux1 manylinux_2_5; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done

fetch() {  # fetch DIR SPEC... : cp312 binary wheels for the host, no dependency resolution
  local dir=$1; shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$dir" "$@"
}

split_wheel() {  # split_wheel WHEEL BYTES DIR_A DIR_B : the first BYTES of WHEEL into DIR_A/NAME.part-a, the rest
                 # into DIR_B/NAME.part-b with the whole wheel's sha256 (the host checks the rejoined wheel against
                 # it), for two carry calls in a row; fails unless the two parts rejoin to the wheel
  local wheel=$1 bytes=$2 dir_a=$3 dir_b=$4 name
  name=$(basename "$wheel")
  head -c "$bytes" "$wheel" > "$dir_a/$name.part-a"
  tail -c +"$((bytes + 1))" "$wheel" > "$dir_b/$name.part-b"
  (cd "$(dirname "$wheel")" && sha256sum "$name") > "$dir_b/$name.sha256"
  cat "$dir_a/$name.part-a" "$dir_b/$name.part-b" | cmp - "$wheel"
}

dir_bytes() {  # dir_bytes PATH... : the bytes of everything under the paths, together
  du -cb "$@" | tail -1 | cut -f1
}

print_dir_sizes() {  # print_dir_sizes BASE NAME... : "NAME: N bytes" for each BASE/NAME that exists
  local base=$1 name; shift
  for name in "$@"; do
    if [ -d "$base/$name" ]; then echo "$name: $(dir_bytes "$base/$name") bytes"; fi
  done
}
