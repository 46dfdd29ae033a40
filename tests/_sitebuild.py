"""Build the course site once per test process and share it between test modules.

`mkdocs build --strict` takes several seconds; the site tests and the browser
tests both need its output, so the first caller builds and the rest reuse it.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300


@dataclass(frozen=True)
class BuiltSite:
    path: Path
    seconds: float
    log: str


_cache: dict[str, BuiltSite] = {}
_reported: set[str] = set()


def build_site(solutions: bool = True) -> BuiltSite:
    """The site as published (`solutions`), or the instructor build without the reference
    solutions (COURSE_SITE_SOLUTIONS=0), built once per process each."""
    key = "site" if solutions else "instructor"
    if key in _cache:
        return _cache[key]
    out = Path(tempfile.mkdtemp(prefix=f"course-{key}-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
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
    _cache[key] = BuiltSite(out, seconds, log)
    return _cache[key]


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
