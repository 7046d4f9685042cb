"""Turn host.sh's list of scenario files into the runs it makes, one tab-separated line per run.

Usage (from the source root, with kvgate's packages importable):
    python scripts/gpu/runplan.py OUT_DIR SCENARIO[@cpu_bytes_to_use=N][@fresh=reset|restart|keep] ...

Each scenario file is validated as the runner will load it. Its `server:` block (gateway/devtools/loadtest/server.py)
says what each arm's vLLM server runs with; a list of offload tier sizes expands into one run per size. For each run
this writes OUT_DIR/<run>.yaml (the scenario with the run's name and its concrete server settings) and prints
    RUN<TAB>SCENARIO_COPY<TAB>OFFLOAD_SETTING<TAB>CONTROL_SETTING<TAB>FRESH
where a setting is `none` or `CONNECTOR:CPU_BYTES` (what scripts/gpu/vllm_server.sh reads). An `@key=value` suffix
overrides the file for this invocation only, so the coordinator can change a size without editing the file.
Exits 2 with the file and the problem on stderr when a scenario cannot be run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.devtools.loadtest.model import ScenarioError, load_scenario
from gateway.devtools.loadtest.server import ServerSpec, arm_setting


def parse_entry(entry: str) -> tuple[Path, dict[str, str]]:
    path, *overrides = entry.split("@")
    pairs = dict(item.split("=", 1) for item in overrides if "=" in item)
    unknown = sorted(set(pairs) - {"cpu_bytes_to_use", "fresh"}) + [item for item in overrides if "=" not in item]
    if unknown:
        raise ScenarioError(f"{entry}: unknown override {unknown[0]!r} (cpu_bytes_to_use=N[/M...], fresh=...)")
    return Path(path), pairs


def apply_overrides(raw: dict[str, Any], overrides: dict[str, str]) -> dict[str, Any]:
    server = dict(raw.get("server") or {})
    if "cpu_bytes_to_use" in overrides:
        sizes = [int(float(part)) for part in overrides["cpu_bytes_to_use"].split("/")]
        server["cpu_bytes_to_use"] = sizes if len(sizes) > 1 else sizes[0]
        if isinstance(server.get("offload"), dict):
            server["offload"] = {k: v for k, v in server["offload"].items() if k != "cpu_bytes_to_use"}
    if "fresh" in overrides:
        server["fresh"] = overrides["fresh"]
    return {**raw, "server": server}


def concrete_server(spec: ServerSpec, offload: str, control: str) -> dict[str, Any]:
    def arm(setting: str) -> dict[str, Any]:
        connector, _, size = setting.partition(":")
        return {"connector": connector, **({"cpu_bytes_to_use": int(size)} if size else {})}

    return {"offload": arm(offload), "control": arm(control), "fresh": spec.fresh}


def plan(out_dir: Path, entries: list[str]) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    names: set[str] = set()
    for entry in entries:
        path, overrides = parse_entry(entry)
        raw = yaml.safe_load(path.read_text()) if path.is_file() else None
        if not isinstance(raw, dict):
            raise ScenarioError(f"{path}: not a readable scenario file")
        raw = apply_overrides(raw, overrides)
        checked = out_dir / ".check.yaml"
        checked.write_text(yaml.safe_dump(raw, sort_keys=False))
        try:
            scenario = load_scenario(checked)
        except ScenarioError as error:  # name the file the user wrote, not the checked copy
            raise ScenarioError(str(error).replace(str(checked), entry)) from error
        sizes = scenario.server.offload_sizes()
        for size in sizes:
            name = scenario.name if len(sizes) == 1 else f"{scenario.name}-cpu{(size or 0) / 1e9:g}GB"
            while name in names:
                name += "-again"
            names.add(name)
            offload, control = (arm_setting(scenario.server, arm, size) for arm in ("offload", "control"))
            copy = out_dir / f"{name}.yaml"
            run = {**raw, "name": name, "server": concrete_server(scenario.server, offload, control)}
            copy.write_text(yaml.safe_dump(run, sort_keys=False))
            load_scenario(copy)
            lines.append("\t".join([name, str(copy), offload, control, scenario.server.fresh]))
        checked.unlink()
    return lines


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        lines = plan(Path(sys.argv[1]), sys.argv[2:])
    except (ScenarioError, OSError, ValueError, yaml.YAMLError) as error:
        print(f"runplan: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
