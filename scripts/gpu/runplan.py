"""Turn host.sh's list of scenario files into the runs it makes, one tab-separated line per run.

Usage (from the source root, with kvgate's packages importable):
    python scripts/gpu/runplan.py OUT_DIR SCENARIO[@cpu_bytes_to_use=N[/M...]][@fresh=reset|restart|keep]
                                         [@runner=loadtest|hotscan] ...

Each scenario file's `server:` block (gateway/devtools/loadtest/server.py) says what each arm's vLLM server runs
with and which runner sends the traffic; a list of offload tier sizes expands into one run per size. Files for the
`loadtest` runner are validated as that runner will load them; other runners' files only have their `server:`
block checked. A `kind: reuse` file (kvgate plan against the server) has no `server:` block: it loops over its own
`cpu_bytes_to_use` list, so it is one run, booted with its first size. For each run this writes, in OUT_DIR:
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
    # `kind: reuse` files (kvgate plan's predicted-vs-measured runs) go through the same CLI; their runner restarts
    # the offload server once per tier size with CPU_BYTES set, and `ensure` turns a restart into an in-place
    # reset when the server already runs that size (the first size, which host.sh boots it with).
    "reuse": RunnerCommands(
        write_policies=f'"$PY" -m {LOADTEST} "$SCENARIO" --write-policies "$POLICIES" --upstream offload=$OFFLOAD_URL',
        run=(f'"$PY" -m {LOADTEST} "$SCENARIO" --out "$REPORT" --plain --gateway "$GATEWAY"'
             ' --access "$POLICIES/keys.json" --upstream offload=$OFFLOAD_URL --restart-cmd "offload=$ENSURE_OFFLOAD"'),
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


def reuse_runs(raw: dict[str, Any], entry: str) -> tuple[str, str]:
    """A `kind: reuse` file runs its own tier sizes (top-level cpu_bytes_to_use); the offload server boots with
    the first, the control server is left as it is. Returns (offload setting, control setting)."""
    sizes = raw.get("cpu_bytes_to_use")
    if not isinstance(sizes, list) or not sizes or not all(isinstance(size, int) and size > 0 for size in sizes):
        raise ScenarioError(f"{entry}: a reuse scenario needs cpu_bytes_to_use: [positive int, ...]")
    return f"offloading:{sizes[0]}", "none"


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


def unique(name: str, names: set[str]) -> str:
    while name in names:
        name += "-again"
    names.add(name)
    return name


def write_commands(out_dir: Path, name: str, run_commands: RunnerCommands) -> None:
    (out_dir / f"{name}.policies.sh").write_text(run_commands.write_policies + "\n")
    (out_dir / f"{name}.run.sh").write_text(run_commands.run + "\n")


def plan(out_dir: Path, entries: list[str]) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    names: set[str] = set()
    for entry in entries:
        path, overrides = parse_entry(entry)
        raw = yaml.safe_load(path.read_text()) if path.is_file() else None
        if not isinstance(raw, dict) or not raw.get("name"):
            raise ScenarioError(f"{entry}: not a readable scenario file with a name")
        if raw.get("kind") == "reuse":  # its own strict format and its own loop over tier sizes
            if overrides:
                raise ScenarioError(f"{entry}: a reuse scenario takes no @overrides (edit its cpu_bytes_to_use)")
            name = unique(str(raw["name"]), names)
            copy = out_dir / f"{name}.yaml"
            copy.write_text(yaml.safe_dump({**raw, "name": name}, sort_keys=False))
            write_commands(out_dir, name, RUNNERS["reuse"])
            offload, control = reuse_runs(raw, entry)
            lines.append("\t".join([name, str(copy), offload, control, "reset", "reuse"]))
            continue
        raw = apply_overrides(raw, overrides)
        spec = server_spec(raw, entry, out_dir)
        runner, run_commands = commands(spec)
        sizes = spec.offload_sizes()
        for size in sizes:
            name = unique(str(raw["name"]) if len(sizes) == 1 else f"{raw['name']}-cpu{(size or 0) / 1e9:g}GB", names)
            offload, control = (arm_setting(spec, arm, size) for arm in ("offload", "control"))
            copy = out_dir / f"{name}.yaml"
            run = {**raw, "name": name}
            if runner == "loadtest":  # its model knows the block: the report records the concrete settings
                run["server"] = concrete_server(spec, offload, control)
            copy.write_text(yaml.safe_dump(run, sort_keys=False))
            if runner == "loadtest":
                load_scenario(copy)
            write_commands(out_dir, name, run_commands)
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
