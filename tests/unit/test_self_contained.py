"""The repository stands alone: no tracked file refers to a path outside it.

A fresh clone with nothing beside it must build, test and document itself, so tracked files may not point at
material that lives next to the repository (design notes, specs, captures, GPU recipes of the workspace it was
built in) or at absolute paths of that workspace. Checked for every tracked text file:

- a `../` chain that, resolved from the file's own directory, leaves the repository;
- a relative path into the workspace's sibling folders, or into its shared spec/design/fixture/GPU folders;
- an absolute path under the workspace root.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Built from parts, so this file does not match its own patterns.
SIBLINGS = "|".join(["sha" + "red", "ma" + "in", "w" + "t"])
SHARED_FOLDERS = "|".join(["spec", "gpu", "design", "fixtures", "reviews"])
SIBLING_PATH = re.compile(r"(?<![\w.])(?:\.\./)+(?:" + SIBLINGS + r")(?=/|\b)")
SHARED_PATH = re.compile(r"(?<![\w-])" + "sha" + "red" + r"/(?:" + SHARED_FOLDERS + r")\b")
WORKSPACE_PATH = re.compile(r"/" + "wo" + r"rk/")
PARENT_CHAIN = re.compile(r"(?<![\w.])((?:\.\./)+)[\w.-]")


def tracked_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing is tracked")
    return [name for name in listed.stdout.decode().split("\0") if name]


def leaves_repository(file: str, chain: str) -> bool:
    depth = len(PurePosixPath(file).parent.parts)
    return chain.count("../") > depth


def references_outside(file: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        chains = [match.group(1) for match in PARENT_CHAIN.finditer(line)]
        if (SIBLING_PATH.search(line) or SHARED_PATH.search(line) or WORKSPACE_PATH.search(line)
                or any(leaves_repository(file, chain) for chain in chains)):
            found.append(f"{file}:{number}: {line.strip()[:160]}")
    return found


def test_no_tracked_file_refers_outside_the_repository() -> None:
    problems = []
    for name in tracked_files():
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree, or a submodule
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        problems += references_outside(name, data.decode("utf-8", errors="replace"))
    assert not problems, "tracked files refer to paths outside the repository:\n" + "\n".join(problems)


@pytest.mark.parametrize(("file", "line", "outside"), [
    ("README.md", "see [the contract](../" + "sha" + "red/spec/contract.md)", True),
    ("scripts/gpu/stage.sh", "DIR=${DIR:-$ROOT/../" + "sha" + "red/gpu}", True),
    ("docs/deploy/helm.md", "[policies](../policies.md)", False),
    ("docs/deploy/helm.md", "[readme](../../README.md)", False),
    ("docs/deploy/helm.md", "[elsewhere](" + "../" * 3 + "elsewhere.md)", True),
    ("deploy/compose/compose.yaml", "context: ../..", False),
    ("loadtests/x.py", "open('/" + "wo" + "rk/shared/x')", True),
    ("tests/unit/test_paths.py", 'assert check("/v1/../admin")', False),
])
def test_the_check_itself(file: str, line: str, outside: bool) -> None:
    assert bool(references_outside(file, line)) is outside
