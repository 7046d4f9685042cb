"""The hot-plus-scan workload and the admission A/B it drives (`python -m loadtests.hotscan`)."""
