#!/usr/bin/env python3
"""Container HEALTHCHECK: probe the services the entrypoint started.

The entrypoint writes one line per service ("jupyter HOST PORT" or
"ssh HOST PORT") to $COURSE_RUN_DIR/services. A container running a plain
command has no such file and counts as healthy.
"""

import os
import socket
import sys
import urllib.request
from pathlib import Path

TIMEOUT_S = 3.0


def jupyter_ok(host: str, port: int) -> bool:
    # /api answers with the server version and needs no token, so the probe
    # never has to know the secret.
    url = f"http://{host}:{port}/api"
    if ":" in host:
        url = f"http://[{host}]:{port}/api"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        return response.status == 200


def ssh_ok(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as conn:
        return conn.recv(4).startswith(b"SSH-")


PROBES = {"jupyter": jupyter_ok, "ssh": ssh_ok}


def main() -> int:
    services = Path(os.environ.get("COURSE_RUN_DIR", "/tmp/course-run")) / "services"
    if not services.is_file():
        return 0
    failed = []
    for line in services.read_text().splitlines():
        if not line.strip():
            continue
        name, host, port = line.split()
        try:
            ok = PROBES[name](host, int(port))
        except (OSError, KeyError, ValueError):
            ok = False
        if not ok:
            failed.append(f"{name} on {host}:{port}")
    if failed:
        print("unhealthy: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
