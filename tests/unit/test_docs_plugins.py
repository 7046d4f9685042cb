"""The pytest plugins the docs name are installable as the docs say: each `pytest-*` package named in
README.md or tests/README.md is in the `test` extra, or the same paragraph says to `pip install` it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", ROOT / "tests" / "README.md")
PLUGIN = re.compile(r"\bpytest-[a-z][a-z0-9-]*[a-z0-9]\b")


def extra_packages() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = (re.match(r"[A-Za-z0-9._-]+", entry) for entry in project["optional-dependencies"]["test"])
    return {name[0].lower() for name in names if name is not None}


def uninstallable_plugins(text: str, extra: set[str]) -> list[str]:
    """Plugins a paragraph names that neither the extra nor that paragraph's own `pip install` provides."""
    problems = []
    for paragraph in re.split(r"\n\s*\n", text):
        for plugin in sorted(set(PLUGIN.findall(paragraph))):
            if plugin not in extra and f"pip install {plugin}" not in paragraph:
                problems.append(f"{plugin}: {paragraph.strip()[:120]}")
    return problems


def test_every_named_plugin_is_in_the_test_extra_or_comes_with_its_install_line() -> None:
    extra = extra_packages()
    problems = [f"{doc.relative_to(ROOT)}: {problem}" for doc in DOCS
                for problem in uninstallable_plugins(doc.read_text(), extra)]
    assert problems == []


def test_the_check_catches_a_plugin_named_without_a_way_to_install_it() -> None:
    extra = {"pytest", "pytest-timeout"}
    assert uninstallable_plugins("Runs under pytest-timeout and pytest-xdist.", extra) == [
        "pytest-xdist: Runs under pytest-timeout and pytest-xdist."]
    assert uninstallable_plugins("Optional: `pip install pytest-xdist`, then `-n 4`.", extra) == []
