"""`kvgate loadtest SCENARIO`: the offload A/B protocol through the gateway (the runner lives in
`loadtests/scenario/`, so it needs a source checkout; the flags are defined here so `kvgate --help` works
everywhere)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _pair(text: str) -> tuple[str, str]:
    arm, separator, value = text.partition("=")
    if not separator or not arm or not value:
        raise argparse.ArgumentTypeError(f"expected ARM=VALUE, got {text!r}")
    return arm, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run the offload A/B protocol (cold, repeat, pressure, return, restart) through the "
                          "gateway and write report.json, report.md and PNG plots.")
    parser.add_argument("scenario", type=Path, nargs="?", help="scenario YAML (see loadtests/scenarios/)")
    parser.add_argument("--out", type=Path, help="report folder (default: loadtests/reports/<scenario>-<UTC time>)")
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
    parser.set_defaults(command=run)


def _checkout_root() -> Path | None:
    """The source checkout this package runs from (an editable install), if it has the runner."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "loadtests" / "scenario" / "cli.py").is_file() else None


def run(args: argparse.Namespace) -> int:
    root = _checkout_root()
    if root is not None and str(root) not in sys.path:
        sys.path.append(str(root))  # the console script's sys.path holds neither the cwd nor the checkout
    try:
        from loadtests.scenario import cli
    except ImportError:
        print("kvgate loadtest needs a kvgate source checkout (the loadtests/ folder); run it from the repo root",
              file=sys.stderr)
        return 2
    result: int = cli.run(args)
    return result
