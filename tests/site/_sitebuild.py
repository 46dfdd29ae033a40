"""Build the course site once per test run and share it between test modules.

`mkdocs build --strict` takes several seconds; the site tests and the browser
tests both need its output, so the first caller builds and the rest reuse it.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `mkdocs build --strict` took 55 s on an idle 2-core machine, 127 s in a CI run beside a
# busy loop and the other worker's launches, and a second build in that run did not end
# within the 180 s that pytest-timeout then gave the test whose fixture built it (so every
# browser test failed). The build's own deadline is about 3 times the loaded 127 s, and a
# test that may build the site is given that plus its own TEST_ALLOWANCE_S.
BUILD_TIMEOUT_S = 400
TEST_ALLOWANCE_S = 120
TEST_TIMEOUT_S = BUILD_TIMEOUT_S + TEST_ALLOWANCE_S


@dataclass(frozen=True)
class BuiltSite:
    path: Path
    seconds: float
    log: str


_cache: dict[str, BuiltSite] = {}
_reported: set[str] = set()


def shared_folder(tmp_path_factory) -> Path | None:
    """Under pytest-xdist, the folder all workers of this run share (their base temporary
    folders' parent, which pytest cleans up); None in a single process."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return tmp_path_factory.getbasetemp().parent


def build_site(solutions: bool = True, shared: Path | None = None) -> BuiltSite:
    """The site as published (`solutions`), or the instructor build without the reference
    solutions (COURSE_SITE_SOLUTIONS=0), built once per process each; with `shared` (see
    shared_folder), once per test run: the first worker builds under a lock, the others
    wait for it and reuse its output (a build is about 20 s of CPU on 2 cores)."""
    key = "site" if solutions else "instructor"
    if key in _cache:
        return _cache[key]
    if shared is not None:
        with open(shared / f"course-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            done = shared / f"course-{key}" / "built.json"
            if not done.exists():
                done.parent.mkdir(exist_ok=True)
                built = _build(solutions, done.parent / "site")
                done.write_text(json.dumps({"seconds": built.seconds, "log": built.log}))
            facts = json.loads(done.read_text())
        _cache[key] = BuiltSite(done.parent / "site", facts["seconds"], facts["log"])
        return _cache[key]
    out = Path(tempfile.mkdtemp(prefix=f"course-{key}-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    _cache[key] = _build(solutions, out)
    return _cache[key]


# What a class deployment's checkout holds: everything the site is built from but the
# reference solutions (and this machine's own caches).
CHECKOUT_LEAVES_OUT = ("solutions", ".git", ".venv", "*.egg-info", "__pycache__", ".*_cache")


def _build(solutions: bool, out: Path) -> BuiltSite:
    """mkdocs build --strict; the instructor build (not `solutions`) from a copy of the
    repository without solutions/, as a class deploys it."""
    start = time.perf_counter()
    root = ROOT
    if not solutions:
        root = Path(tempfile.mkdtemp(prefix="course-checkout-")) / "course"
        atexit.register(shutil.rmtree, root.parent, ignore_errors=True)
        shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns(*CHECKOUT_LEAVES_OUT))
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={
            **os.environ,
            "NO_MKDOCS_2_WARNING": "1",
            "COURSE_SITE_SOLUTIONS": str(int(solutions)),
        },
    )
    seconds = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"mkdocs build --strict failed (exit {proc.returncode}):\n{log}")
    return BuiltSite(out, seconds, log)


def load_hook():
    """The site's build hook as a module, so tests reuse its parsers."""
    name = "course_site_hook"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / "course_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def report(config, line: str) -> None:
    """Write a line, once, to the pytest terminal even while output is captured."""
    if line in _reported:
        return
    _reported.add(line)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:  # an xdist worker: no terminal of its own
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)
