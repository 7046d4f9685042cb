"""What each pool's connector honours: LMCache tag stamping and per-connector capability warnings; reading the
connectors' and cache servers' /metrics pages."""
