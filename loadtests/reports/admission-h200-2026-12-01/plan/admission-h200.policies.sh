"$PY" -m loadtests.hotscan "$SCENARIO" --write-policies "$POLICIES" --upstream "$OFFLOAD_URL"
