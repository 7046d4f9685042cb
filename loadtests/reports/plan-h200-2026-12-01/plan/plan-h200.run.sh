"$PY" -m gateway.devtools.loadtest "$SCENARIO" --out "$REPORT" --plain --gateway "$GATEWAY" --access "$POLICIES/keys.json" --upstream offload=$OFFLOAD_URL --restart-cmd "offload=$ENSURE_OFFLOAD"
