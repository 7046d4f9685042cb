"""vLLM KV-cache events: wire decoding (pure) and the ZMQ subscriber (I/O)."""
