"""The flags of `kvgate loadtest` (also `python -m gateway.devtools.loadtest`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _pair(text: str) -> tuple[str, str]:
    arm, separator, value = text.partition("=")
    if not separator or not arm or not value:
        raise argparse.ArgumentTypeError(f"expected ARM=VALUE, got {text!r}")
    return arm, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run the offload A/B protocol (cold, repeat, pressure, return, restart) through the "
                          "gateway and write report.json, report.md and PNG plots.")
    parser.add_argument("scenario", type=Path, nargs="?",
                        help="scenario YAML (see loadtests/scenarios/; default: the bundled simulator one)")
    parser.add_argument("--out", type=Path,
                        help="report folder (default: loadtests/reports/<scenario>-<UTC time> in a checkout, "
                             "else kvgate-loadtest-reports/...)")
    parser.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    target = parser.add_argument_group(
        "an already-running stack (default: start simulators and a gateway on loopback)")
    target.add_argument("--gateway", help="gateway base URL, e.g. http://127.0.0.1:8080")
    target.add_argument("--access", type=Path, help="keys.json: admin key, tenant keys and users per arm")
    target.add_argument("--upstream", type=_pair, action="append", default=[], metavar="ARM=URL",
                        help="an arm's vLLM base URL, for /metrics and /health (repeatable)")
    target.add_argument("--restart-cmd", type=_pair, action="append", default=[], metavar="ARM=CMD",
                        help="shell command that restarts an arm's upstream (returns once the old process is gone)")
    target.add_argument("--pid", type=_pair, action="append", default=[], metavar="ARM=PID",
                        help="an arm's upstream PID, for RSS sampling")
    target.add_argument("--pid-file", type=_pair, action="append", default=[], metavar="ARM=PATH",
                        help="file holding an arm's upstream PID, re-read at each sample (follows restarts)")
    setup = parser.add_argument_group("other actions")
    setup.add_argument("--write-policies", type=Path, metavar="DIR",
                       help="write a policy directory for the scenario (pools from --upstream/--kv-events) and "
                            "DIR/keys.json, then exit; serve it with `kvgate serve --policies DIR`")
    setup.add_argument("--kv-events", type=_pair, action="append", default=[], metavar="ARM=ENDPOINT",
                       help="with --write-policies: an arm's vLLM KV-event endpoint, e.g. tcp://127.0.0.1:5557")
    setup.add_argument("--render", type=Path, metavar="DIR",
                       help="redraw report.md and the plots from DIR/report.json, then exit")
