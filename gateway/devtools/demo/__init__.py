"""`kvgate demo`: simulated offload + control servers, the gateway with the example policies,
a short multi-tenant workload, and a per-tenant report. Leaves no process behind."""

from gateway.devtools.demo.run import run_demo

__all__ = ["run_demo"]
