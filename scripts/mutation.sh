#!/usr/bin/env bash
# Mutation score of the modules that carry the README's promises (auth, routes, rewrite, salts, SSE scanning,
# rollout, ledger lifecycle and attribution, the salt index, sequence tracking), killed by the fast unit tier
# only (tests/unit: about a second per mutant run). Modules and test selection: [tool.mutmut] in pyproject.toml.
# Not part of CI. The latest score and every surviving mutant, with the reason it survives, are in
# tests/mutation-2026-12-01.md.
#
#   bash scripts/mutation.sh            # fresh run, then the list of survivors
#   MUTATION_CHILDREN=1 bash scripts/mutation.sh
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[test,mutation]'

rm -rf mutants  # mutmut keeps results between runs; start clean so the score is today's
# Each mutant runs in a forked worker with a CPU-time limit derived from the clean run's duration
# (timeout_multiplier and timeout_constant in pyproject.toml); pytest-timeout bounds each test as well.
.venv/bin/mutmut run --max-children "${MUTATION_CHILDREN:-2}" > mutants-run.log 2>&1 || { tail -40 mutants-run.log; exit 1; }
.venv/bin/mutmut export-cicd-stats >/dev/null
.venv/bin/python - <<'PY'
import json
stats = json.load(open("mutants/mutmut-cicd-stats.json"))
killed = stats["killed"] + stats["timeout"]
print(f"mutants: {stats['total']}  killed: {killed}  survived: {stats['survived']}  no tests: {stats['no_tests']}"
      f"  score: {100 * killed / stats['total']:.1f} %")
PY
echo "survivors (mutmut show NAME prints the change):"
.venv/bin/mutmut results
