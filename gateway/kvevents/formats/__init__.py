"""KV-event payload formats: one decoder per format, chosen by a source's `format` (policy `kv_events`)."""
