"""nginx as a reference proxy on the same cores (the parity target in docs/proxy-costs.md).

One worker, `proxy_buffering off`, HTTP/1.1 keep-alive to the upstream: the configuration measured there. Request
bodies of up to 1 MiB are buffered in memory (since 2026-12-02; no earlier benchmark sent a body over 16 KiB).
Used only where an `nginx` binary is installed (Debian: `apt-get install nginx-light`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.devtools.localproc import ServerProcess, free_port, run_server

SEARCHED = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    return found or next((path for path in SEARCHED if Path(path).exists()), None)


def nginx_config(prefix: Path, port: int, upstream_url: str) -> str:
    temp = "\n".join(f"    {kind}_temp_path {prefix}/{kind}_temp;" for kind in
                     ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    # Request bodies are buffered whole in memory, as kvgate and the router hold them, before going upstream: by
    # default nginx writes a body over 16 KiB to a temporary file, which its unprivileged worker may not create
    # in this prefix (the prompt-size comparison sends up to 550 KiB).
    client_body_buffer_size 1m;
    client_max_body_size 4m;
{temp}
    upstream fast {{ server {upstream_url.removeprefix("http://")}; keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /livez {{ return 200 "ok"; }}
        location / {{
            proxy_pass http://fast;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


@contextmanager
def run_nginx(binary: str, prefix: Path, upstream_url: str) -> Iterator[ServerProcess]:
    """nginx in the foreground (master + one worker) until the block exits; stopped by the master's PID."""
    prefix.mkdir(parents=True)
    port = free_port()
    config = prefix / "nginx.conf"
    config.write_text(nginx_config(prefix, port, upstream_url))
    argv = [binary, "-p", str(prefix), "-c", str(config), "-e", str(prefix / "error.log")]
    with run_server(argv, port, prefix / "stdout.log", ready_path="/livez") as server:
        yield server
