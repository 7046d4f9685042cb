"""Reuse of prompt prefixes, seen without their text: fingerprints, the reuse trace, offload admission."""
