"""proxy layer."""
