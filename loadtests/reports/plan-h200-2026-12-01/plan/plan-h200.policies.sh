"$PY" -m gateway.devtools.loadtest "$SCENARIO" --write-policies "$POLICIES" --upstream offload=$OFFLOAD_URL
