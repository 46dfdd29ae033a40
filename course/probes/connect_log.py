"""When did a process try to reach an address? Every TCP connect, timed, from inside.

With `COURSE_CONNECT_LOG=FILE` in the environment, every process (course/probes/__init__.py)
wraps `socket.socket.connect` and `connect_ex`, the calls under
`socket.create_connection` and every other way Python opens a TCP connection, so
that each attempt appends one line to FILE:

    {"t": 1764612345.12, "host": "127.0.0.1", "port": 29400, "ok": false}

Lesson 07's grader reads it to measure how long a launcher kept trying an endpoint
that never answers, from its first attempt rather than from the process's start
(which, on a loaded machine, is mostly imports).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time

LOG_ENV = "COURSE_CONNECT_LOG"


def install() -> None:
    path = os.environ[LOG_ENV]

    def note(address, ok: bool) -> None:
        if not (isinstance(address, tuple) and len(address) >= 2):
            return  # a Unix socket: not an endpoint
        line = {"t": time.time(), "host": str(address[0]), "port": address[1], "ok": ok}
        try:
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError:
            pass

    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    @functools.wraps(connect)
    def logged_connect(self, address):
        try:
            connect(self, address)
        except OSError:
            note(address, False)
            raise
        note(address, True)

    @functools.wraps(connect_ex)
    def logged_connect_ex(self, address):
        code = connect_ex(self, address)
        note(address, code == 0)
        return code

    socket.socket.connect, socket.socket.connect_ex = logged_connect, logged_connect_ex


def read(path) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []
