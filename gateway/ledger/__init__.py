"""Block-lifecycle ledger (docs/reports.md): attribution, lifecycle, stores, audit report, service."""
