"""Tooling for the real-vLLM test tier: installer, tiny-model builder and server launcher.

Every module here uses only the standard library (plus httpx for the launcher), so each one can run
from the project's virtualenv or by hand, e.g. ``python -m tests.realvllm.tooling.install_vllm``.
"""
