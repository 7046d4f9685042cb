"""kvgate: a policy-aware OpenAI-compatible gateway for vLLM KV-cache offloading."""

__version__ = "0.1.0"
