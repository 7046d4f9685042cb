"$PY" scripts/gpu/lmcache_client.py policies "$POLICIES" --lm "$OFFLOAD_URL" --control "$CONTROL_URL" --events "$OFFLOAD_EVENTS"
