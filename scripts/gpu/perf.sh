#!/usr/bin/env bash
# CPU-only measurements on the lent host (16 cores; the GPU is not used): the relay's cost against nginx and the
# Rust vllm-router, the prompt-size cost, `--workers N` scaling and the shadow arm's cost. The host has no
# network, so everything it needs travels in the carried stage folder:
#   bash scripts/gpu/perf_stage.sh            # here: wheels for Python 3.12 + nginx .debs into .stage/perf
#   carry [".stage/perf"]; command: bash scripts/gpu/perf.sh STEP [STEP ...]
# Steps (each writes into $OUT): check, overhead, before, events, prompt, prompt-before, hold, hold-before, idle, workers,
# contention, clients, shadow. Core sets below keep the process under test on its own cores, away from the upstream
# and the load generators.
#   before: the overhead benchmark with an earlier tree's gateway/ and loadtests/ (BEFORE, default .stage/before,
#           made with `git archive <commit> gateway loadtests | tar -x -C .stage/before`; carry it too)
#   prompt-before: the prompt-size benchmark with the BEFORE tree's gateway/ and loadtests/ (PROMPT_ARGS too);
#           alternate it with `prompt` (e.g. `prompt-before prompt prompt-before prompt`), each round its own file
#   hold, hold-before: how long the reuse trace holds the event loop (loadtests/trace_hold.py; HOLD_ARGS), this
#           tree and the BEFORE tree (give BEFORE this tree's loadtests/ to compare the finish, which older ones lack)
#   events: the overhead benchmark at c=32 with one token per answer (EVENTS_ARGS), to split the per-request
#           cost into its fixed part and its per-event part against the 64-token run
#   contention: how much slower one core runs the same Python work while 1, 3, 7, 15 other cores do too
#           (loadtests/core_contention.py; CONTENTION_ARGS), the host's share of the `--workers N` ratio
#   clients: CPU per streamed answer read by kvgate's upstream client, aiohttp and pyreqwest (loadtests/shadow_read.py)
#   (OVERHEAD_ARGS="--granian ..." adds kvgate's app served by granian to the overhead run)
set -uo pipefail
STAGE=${STAGE:-.stage/perf}
OUT=${OUT:-/tmp/kvg-perf}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-12}
mkdir -p "$OUT" /tmp/ngx
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$STAGE"/whl/*.whl \
  || exit 1
for deb in "$STAGE"/deb/*.deb; do dpkg -x "$deb" /tmp/ngx; done
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:/tmp/ngx/usr/sbin:/tmp/ngx/usr/bin:$PATH PYTHONUNBUFFERED=1
# wrk's LuaJIT, unpacked beside it (only wrk links it)
export LD_LIBRARY_PATH=/tmp/ngx/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# "" for a step's first run in $OUT, then -2, -3, ...: a step named twice keeps both rounds
next_round() {
  local n=1
  while [ -e "$OUT/$1$([ $n -gt 1 ] && echo "-$n").json" ]; do n=$((n + 1)); done
  [ $n -gt 1 ] && echo "-$n"
}

# One run of `python3 -m loadtests.MODULE` into $OUT/NAME.json and NAME.log (NAME-2, -3, ... for a step named again).
numbered() {
  local module=$1 name=$2$(next_round "$2")
  shift 2
  python3 -m "loadtests.$module" --out "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log"
}

# A command run in the BEFORE tree, importing its gateway/ and loadtests/.
in_before() {
  (cd "${BEFORE:-.stage/before}" && export PYTHONPATH=/tmp/site:$PWD && "$@")
}

step() {
  case "$1" in
    check)
      { nproc; python3 -V; nginx -v 2>&1; wrk --version 2>&1 | head -1; taskset -pc $$; vllm-router --help | head -3
        python3 -c "import gateway, uvloop, vllm_router_rs, granian, pyreqwest; print('imports ok')"; } 2>&1 | tee "$OUT/check.txt" ;;
    overhead)
      python3 -m loadtests.proxy_overhead --out "$OUT/overhead.json" --rounds "$ROUNDS" --duration "$DURATION" \
        ${OVERHEAD_ARGS:-} 2>&1 | tee "$OUT/overhead.log" ;;
    before)
      (cd "${BEFORE:-.stage/before}" && PYTHONPATH=/tmp/site:$PWD python3 -m loadtests.proxy_overhead \
        --out "$OUT/overhead-before.json" --rounds "$ROUNDS" --duration "$DURATION" --no-nginx --no-router \
        ${OVERHEAD_ARGS:-} 2>&1 | tee "$OUT/overhead-before.log") ;;
    events)
      python3 -m loadtests.proxy_overhead --out "$OUT/events.json" --rounds "$ROUNDS" --duration "$DURATION" \
        --concurrency 32 --tokens 1 ${EVENTS_ARGS:-} 2>&1 | tee "$OUT/events.log" ;;
    idle)
      python3 -m loadtests.idle_memory --out "$OUT/idle.json" --runs 3 --attribute 2>&1 | tee "$OUT/idle.log" ;;
    prompt) numbered prompt_size prompt ${PROMPT_ARGS:-} ;;
    prompt-before) in_before numbered prompt_size prompt-before ${PROMPT_ARGS:-} ;;
    hold) numbered trace_hold hold ${HOLD_ARGS:-} ;;
    hold-before) in_before numbered trace_hold hold-before ${HOLD_ARGS:-} ;;
    workers)
      python3 -m loadtests.workers_scaling --out "$OUT/workers" ${WORKERS_ARGS:-} 2>&1 | tee "$OUT/workers.log" ;;
    contention)
      python3 -m loadtests.core_contention --out "$OUT/contention.json" ${CONTENTION_ARGS:-} 2>&1 \
        | tee "$OUT/contention.log" ;;
    clients)
      python3 -m loadtests.shadow_read --duration "$DURATION" ${CLIENTS_ARGS:-} 2>&1 | tee "$OUT/clients.log" ;;
    shadow)
      python3 -m loadtests.shadow_cost --out "$OUT/shadow.json" ${SHADOW_ARGS:-} 2>&1 | tee "$OUT/shadow.log" ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}

status=0
for name in "$@"; do
  echo "== $name $(date -u +%T)"
  step "$name" || status=1
done
exit $status
