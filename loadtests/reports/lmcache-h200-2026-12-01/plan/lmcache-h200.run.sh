"$PY" scripts/gpu/lmcache_client.py run --gateway "$GATEWAY" --keys "$POLICIES/keys.json" --lm "$OFFLOAD_URL" --control "$CONTROL_URL" --out "$REPORT" --tokens 8000
