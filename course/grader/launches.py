"""The launches a lesson's tests share: started once, for the tests selected to run, and
cached in the test module; and, with `pytest -n N`, a test file's tests sent to one
worker, so that they are started once in all.

    return shared(_runs, backend, launch)   # launch() starts needed(request, NAMES)

`needed` starts only what the selected tests read (@pytest.mark.needs), `shared` fails the
later tests at once when the first attempt never finished, and `file_scheduling` is the
xdist scheduler the grader's plugin installs (tests/conftest.py refines it for the
course's own suite).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from course.grader.imports import exercises_of, import_check_for


def needed(request, every) -> list[str]:
    """Which of the shared launches (or case-script cases) `every` the tests selected to
    run in this module need. Of the tests that use the requesting fixture, one marked
    @pytest.mark.needs("a", "b") needs those (a name may use the test's parameters,
    "ring_{world}"), an unmarked one needs them all. A full grade
    launches everything at once, as before; a grade of one test (`-k`, a mutant's
    `caught_by`) launches only what that test reads."""
    want: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        if request.fixturename not in getattr(item, "fixturenames", ()):
            continue
        check = import_check_for(item)
        if check is not None and check.cancel_for(exercises_of(item)).event.is_set():
            continue  # its file is broken: it fails at once, and a case of it could hang
        marker = item.get_closest_marker("needs")
        params = getattr(getattr(item, "callspec", None), "params", {})
        # A name may use the test's parameters: needs("ring_{world}").
        want |= {a.format(**params) for a in marker.args} if marker is not None else set(every)
    return [name for name in every if name in want]


class _Interrupted:
    """The mark a shared launch leaves in its cache while it runs (see shared)."""


def shared(cache: dict, key, launch):
    """cache[key], made by launch() the first time: the launches a lesson's tests share.

    If that first attempt never finished (pytest-timeout stopped its test, say), the
    later tests fail at once, pointing at it, instead of starting the launches again."""
    if isinstance(cache.get(key), _Interrupted):
        pytest.fail(
            "the launches this test reads were interrupted in an earlier test, which "
            "reports why; they are not started again",
            pytrace=False,
        )
    if key not in cache:
        cache[key] = _Interrupted()
        cache[key] = launch()
    return cache[key]


def file_scheduling(config, log, scope: Callable[[str, str], str] | None = None):
    """xdist's LoadScopeScheduling with a test file as the scope: a file's tests go to one
    worker together, since a lesson's tests share launches cached in their module (and
    other files share module fixtures): sent to two workers, each would run them. Files
    go out in the items' order (the collection's, which a conftest may sort), not in
    xdist's order by number of tests. `scope(nodeid, file)`, when given, names the scope
    of each test instead (its nodeid: a test on its own; a name: files together)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the items' order is the schedule

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return scope(nodeid, file) if scope is not None else file

    return FileScheduling(config, log)
