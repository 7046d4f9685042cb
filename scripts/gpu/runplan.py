"""Turn host.sh's list of scenario files into the runs it makes, one tab-separated line per run.

Usage (from the source root, with kvgate's packages importable):
    python scripts/gpu/runplan.py OUT_DIR SCENARIO[@cpu_bytes_to_use=N[/M...]][@fresh=reset|restart|keep]
                                         [@runner=loadtest|hotscan] ...

Each scenario file's `server:` block (gateway/devtools/loadtest/server.py) says what each arm's vLLM server runs
with and which runner sends the traffic; a list of offload tier sizes expands into one run per size. Files for the
`loadtest` runner are validated as that runner will load them; other runners' files only have their `server:`
block checked. For each run this writes, in OUT_DIR:
    <run>.yaml         the scenario with the run's name and its concrete server settings
    <run>.policies.sh  the command that writes the run's policy directory ($POLICIES)
    <run>.run.sh       the command that sends the traffic through the gateway and writes $REPORT
and prints  RUN<TAB>SCENARIO_COPY<TAB>OFFLOAD_SETTING<TAB>CONTROL_SETTING<TAB>FRESH<TAB>RUNNER
where a setting is `none` or `CONNECTOR:CPU_BYTES` (what scripts/gpu/vllm_server.sh reads). An `@key=value` suffix
overrides the file for this invocation only, so the coordinator can change a size without editing the file.
Exits 2 with the file and the problem on stderr when a scenario cannot be run; then nothing is printed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.devtools.loadtest.model import ScenarioError, load_scenario
from gateway.devtools.loadtest.server import RunnerCommands, ServerSpec, arm_setting

LOADTEST = "gateway.devtools.loadtest"
RUNNERS = {
    "loadtest": RunnerCommands(
        write_policies=(f'"$PY" -m {LOADTEST} "$SCENARIO" --write-policies "$POLICIES"'
                        " --upstream offload=$OFFLOAD_URL --upstream control=$CONTROL_URL"
                        " --kv-events offload=$OFFLOAD_EVENTS --kv-events control=$CONTROL_EVENTS"),
        run=(f'"$PY" -m {LOADTEST} "$SCENARIO" --out "$REPORT" --plain --gateway "$GATEWAY"'
             ' --access "$POLICIES/keys.json" --upstream offload=$OFFLOAD_URL --upstream control=$CONTROL_URL'
             ' --pid-file offload="$OFFLOAD_PIDFILE" --pid-file control="$CONTROL_PIDFILE"'
             ' --restart-cmd "offload=$RESTART_OFFLOAD" --restart-cmd "control=$RESTART_CONTROL"'),
    ),
    # Both admission arms use the offload server, one after the other; between them the server's GPU cache and
    # CPU tier are emptied in place (RESET_OFFLOAD, under a second) instead of a 60-90 s restart.
    "hotscan": RunnerCommands(
        write_policies='"$PY" -m loadtests.hotscan "$SCENARIO" --write-policies "$POLICIES" --upstream "$OFFLOAD_URL"',
        run=('"$PY" -m loadtests.hotscan "$SCENARIO" --gateway "$GATEWAY" --access "$POLICIES/keys.json"'
             ' --upstream "$OFFLOAD_URL" --restart-cmd "$RESET_OFFLOAD" --out "$REPORT"'),
    ),
}


def parse_entry(entry: str) -> tuple[Path, dict[str, str]]:
    path, *overrides = entry.split("@")
    pairs = dict(item.split("=", 1) for item in overrides if "=" in item)
    unknown = sorted(set(pairs) - {"cpu_bytes_to_use", "fresh", "runner"}) + [i for i in overrides if "=" not in i]
    if unknown:
        raise ScenarioError(f"{entry}: unknown override {unknown[0]!r} (known: cpu_bytes_to_use, fresh, runner)")
    return Path(path), pairs


def apply_overrides(raw: dict[str, Any], overrides: dict[str, str]) -> dict[str, Any]:
    server = dict(raw.get("server") or {})
    if "cpu_bytes_to_use" in overrides:
        sizes = [int(float(part)) for part in overrides["cpu_bytes_to_use"].split("/")]
        server["cpu_bytes_to_use"] = sizes if len(sizes) > 1 else sizes[0]
        if isinstance(server.get("offload"), dict):
            server["offload"] = {k: v for k, v in server["offload"].items() if k != "cpu_bytes_to_use"}
    for key in ("fresh", "runner"):
        if key in overrides:
            server[key] = overrides[key]
    return {**raw, "server": server}


def server_spec(raw: dict[str, Any], entry: str, check_dir: Path) -> ServerSpec:
    """The validated `server:` block; a loadtest scenario is validated whole, as its runner will load it."""
    runner = (raw.get("server") or {}).get("runner", "loadtest")
    if runner == "loadtest":
        checked = check_dir / ".check.yaml"
        checked.write_text(yaml.safe_dump(raw, sort_keys=False))
        try:
            return load_scenario(checked).server
        except ScenarioError as error:  # name the file the user wrote, not the checked copy
            raise ScenarioError(str(error).replace(str(checked), entry)) from error
        finally:
            checked.unlink()
    try:
        return ServerSpec.model_validate(raw.get("server") or {})
    except ValidationError as error:
        problems = "; ".join(f"server.{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
                             for item in error.errors())
        raise ScenarioError(f"{entry}: {problems}") from error


def concrete_server(spec: ServerSpec, offload: str, control: str) -> dict[str, Any]:
    def arm(setting: str) -> dict[str, Any]:
        connector, _, size = setting.partition(":")
        return {"connector": connector, **({"cpu_bytes_to_use": int(size)} if size else {})}

    runner = spec.runner if isinstance(spec.runner, str) else spec.runner.model_dump()
    return {"runner": runner, "offload": arm(offload), "control": arm(control), "fresh": spec.fresh}


def commands(spec: ServerSpec) -> tuple[str, RunnerCommands]:
    if isinstance(spec.runner, str):
        return spec.runner, RUNNERS[spec.runner]
    return "commands", spec.runner


def plan(out_dir: Path, entries: list[str]) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    names: set[str] = set()
    for entry in entries:
        path, overrides = parse_entry(entry)
        raw = yaml.safe_load(path.read_text()) if path.is_file() else None
        if not isinstance(raw, dict) or not raw.get("name"):
            raise ScenarioError(f"{entry}: not a readable scenario file with a name")
        raw = apply_overrides(raw, overrides)
        spec = server_spec(raw, entry, out_dir)
        runner, run_commands = commands(spec)
        sizes = spec.offload_sizes()
        for size in sizes:
            name = str(raw["name"]) if len(sizes) == 1 else f"{raw['name']}-cpu{(size or 0) / 1e9:g}GB"
            while name in names:
                name += "-again"
            names.add(name)
            offload, control = (arm_setting(spec, arm, size) for arm in ("offload", "control"))
            copy = out_dir / f"{name}.yaml"
            run = {**raw, "name": name, "server": concrete_server(spec, offload, control)}
            copy.write_text(yaml.safe_dump(run, sort_keys=False))
            if runner == "loadtest":
                load_scenario(copy)
            (out_dir / f"{name}.policies.sh").write_text(run_commands.write_policies + "\n")
            (out_dir / f"{name}.run.sh").write_text(run_commands.run + "\n")
            lines.append("\t".join([name, str(copy), offload, control, spec.fresh, runner]))
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
