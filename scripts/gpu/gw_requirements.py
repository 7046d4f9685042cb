"""Print `name==version` for every package kvgate needs at run time, as installed in this environment.

Walks the installed `kvgate` distribution's requirements (with the extras they name, e.g. uvicorn[standard])
for the given Python version, so the GPU host can get exactly the versions the local tests ran with.
Usage: python scripts/gpu/gw_requirements.py [--python 3.12]
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _environment(python: str, extra: str) -> dict[str, str]:
    env = {key: str(value) for key, value in default_environment().items()}
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", extra=extra)
    return env


def _wanted(requirement: Requirement, python: str, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate(_environment(python, extra)) for extra in extras or {""})


def pins(root: str, python: str) -> dict[str, str]:
    found: dict[str, str] = {}
    pending: list[tuple[str, set[str]]] = [(root, set())]
    while pending:
        name, extras = pending.pop()
        dist = metadata.distribution(name)
        key = canonicalize_name(name)
        if key in found and not extras:
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            if _wanted(requirement, python, extras):
                pending.append((requirement.name, set(requirement.extras)))
    found.pop(canonicalize_name(root))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", default="3.12")
    args = parser.parse_args()
    for name, version in sorted(pins("kvgate", args.python).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
