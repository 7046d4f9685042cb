"$PY" -m loadtests.hotscan "$SCENARIO" --gateway "$GATEWAY" --access "$POLICIES/keys.json" --upstream "$OFFLOAD_URL" --restart-cmd "$RESET_OFFLOAD" --out "$REPORT"
