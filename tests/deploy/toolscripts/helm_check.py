"""Lint and render a Helm chart for several values cases with the Helm v4 Go SDK (helm-python-sdk).

Runs under the deploy tools' Python. stdin: {"chart": DIR, "kube_version": "v1.30.0",
"cases": {NAME: {"values": {...}, "release": R, "namespace": N}}}.
stdout: {NAME: {"lint": {...}, "manifests": {TEMPLATE: TEXT}} or {"lint": {...}, "error": {"type", "message"}}}.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import helm_python as helm  # type: ignore[import-not-found, unused-ignore]


def check(chart: str, kube_version: str, case: dict[str, Any]) -> dict[str, Any]:
    values = case.get("values") or {}
    lint = helm.lint(chart, values, strict=True, kube_version=kube_version, namespace=case["namespace"])
    result: dict[str, Any] = {"lint": lint}
    try:
        with helm.Chart.load(chart) as loaded:
            loaded.validate_schema(values)
            result["manifests"] = loaded.render(values, name=case["release"], namespace=case["namespace"],
                                                is_install=True)
    except helm.HelmError as error:
        result["error"] = {"type": type(error).__name__, "message": str(error)}
    return result


def main() -> int:
    request = json.load(sys.stdin)
    results = {name: check(request["chart"], request["kube_version"], case)
               for name, case in request["cases"].items()}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
