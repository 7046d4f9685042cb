"""`python -m gateway.sim`: the simulator without the `kvgate` entry point."""

from __future__ import annotations

import argparse

from gateway.sim.cli import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.sim", description="Simulated vLLM server.")
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
