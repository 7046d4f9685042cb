"""Processes the load test and the demo start (gateway.devtools.localproc and loadtest.stack.OwnedServer): real
child processes on loopback, started, restarted in place, stopped by PID; a child that dies while starting is
reported with its log; the environment it gets is the one asked for."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import httpx
import pytest

from gateway.devtools.loadtest.stack import OwnedServer
from gateway.devtools.localproc import free_port, free_port_pair, kvgate_command, run_server

# A stdlib HTTP server whose every answer carries its PID and one environment variable, so a test can tell
# which process answered and what it was given.
SERVER = """
import http.server, os, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{os.getpid()} {os.environ.get('PROBE_VALUE', '-')} {'HOME' in os.environ}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _argv(port: int) -> list[str]:
    return [sys.executable, "-c", SERVER, str(port)]


def _answer(url: str) -> list[str]:
    return httpx.get(f"{url}/health", timeout=10.0).text.split()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_owned_server_starts_restarts_in_place_and_stops(tmp_path: Path) -> None:
    port = free_port()
    server = OwnedServer(_argv(port), port, tmp_path / "server.log", env={"PROBE_VALUE": "first"})
    try:
        server.start()
        first = server.pid()
        assert first is not None and server.starts == 1
        assert _answer(server.url)[:2] == [str(first), "first"]
        server.env["PROBE_VALUE"] = "second"
        server.restart(30.0)
        second = server.pid()
        assert second is not None and second != first and server.starts == 2
        assert _gone(first)  # stopped and reaped before the new one started
        assert _answer(server.url)[:2] == [str(second), "second"]  # same port, new process, new environment
    finally:
        server.stop()
    assert server.pid() is None and _gone(second)
    server.stop()  # stopping twice is harmless


def test_a_server_that_dies_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    script = "import sys; print('unknown flag --frobnicate', flush=True); sys.exit(3)"
    server = OwnedServer([sys.executable, "-c", script], free_port(), tmp_path / "bad.log")
    with pytest.raises(RuntimeError, match=r"process exited with 3:\nunknown flag --frobnicate"):
        server.start()
    assert server.pid() is None and server.starts == 1


def test_the_log_is_appended_across_restarts(tmp_path: Path) -> None:
    log = tmp_path / "sim.log"
    log.write_text("earlier run\n")
    script = "import sys; print('run', flush=True); sys.exit(1)"
    server = OwnedServer([sys.executable, "-c", script], free_port(), log)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            server.start()
    assert log.read_text() == "earlier run\nrun\nrun\n"


@pytest.mark.parametrize(("drop_prefixes", "home_seen"), [((), "True"), (("HO",), "False")])
def test_run_server_gives_exactly_the_environment_asked_for(
    tmp_path: Path, drop_prefixes: tuple[str, ...], home_seen: str
) -> None:
    port = free_port()
    env = {"PROBE_VALUE": "given", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    with run_server(_argv(port), port, tmp_path / "s.log", env=env, ready_path="/",
                    drop_prefixes=drop_prefixes) as server:
        pid = server.popen.pid
        assert _answer(server.url) == [str(pid), "given", home_seen]
    assert server.popen.returncode is not None and _gone(pid)


def test_free_ports_are_bindable_and_a_pair_has_a_free_successor() -> None:
    for port in (free_port(), free_port_pair()):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    pair = free_port_pair()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", pair + 1))


def test_kvgate_commands_run_this_interpreter() -> None:
    assert kvgate_command("sim", "--port", "1") == [sys.executable, "-m", "gateway", "sim", "--port", "1"]
