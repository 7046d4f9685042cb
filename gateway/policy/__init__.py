"""Policy files: their models, loading and hot reload."""
