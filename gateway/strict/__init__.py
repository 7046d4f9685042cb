"""Strict handling of request-body fields: the types of fields the gateway reads, and the fields that steer vLLM."""
