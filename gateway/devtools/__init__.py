"""devtools layer."""
