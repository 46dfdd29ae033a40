"""Loaded at start-up by every Python process that has this folder on its PYTHONPATH.

`python -m course bench` puts it there, with COURSE_STEP_LOG set, so that the
lesson's processes (the launcher, mp.spawn's ranks, torchrun's workers) time
their optimizer steps: see course/step_clock.py. Without COURSE_STEP_LOG it
does nothing and imports nothing. Afterwards it runs the sitecustomize this
one shadows, if the Python installation has one.
"""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("COURSE_STEP_LOG"):
    from course import step_clock

    step_clock.install()

_here = os.path.dirname(os.path.abspath(__file__))
_others = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
