"""http layer."""
