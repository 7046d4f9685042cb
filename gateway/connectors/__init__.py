"""What each pool's connector honours: LMCache tag stamping and per-connector capability warnings."""
