"""`kvgate loadtest`: the offload A/B protocol (cold, repeat, pressure, return, restart) through the gateway.

A scenario (YAML, `loadtests/scenarios/`) names the tenants, prefix lengths, the pressure set, repetitions and
concurrency. The runner drives the traffic through the gateway with the tenants' keys, so salts, caps, rollout
and the KV-event ledger are all in the loop, scrapes every upstream's `/metrics` around each phase, and writes
`report.json`, `report.md` and PNG plots.
"""
