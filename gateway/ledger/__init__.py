"""Block-lifecycle ledger (contract §6): attribution, lifecycle, stores, audit report, service."""
