"""Admission limits: connections, request shape, in-flight and per-minute caps (docs/limits.md)."""
