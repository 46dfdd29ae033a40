"""Loaded at start-up by every Python process that has this folder on its PYTHONPATH.

course.launch puts it there for every process it launches (the grader's,
`python -m course run`'s, `course bench`'s). When one of the COURSE_*
variables of course/probes/__init__.py is set, it installs those probes; otherwise it
does nothing else. Afterwards it runs the sitecustomize this
one shadows, if the Python installation has one. With COURSE_WARM_SOCKET set, it first
hands the whole program to the launch's zygote (course/launch/warm/).
"""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("COURSE_WARM_SOCKET"):  # a zygote runs this program: course/launch/warm/
    try:
        from course.launch.warm import client
    except ImportError:
        pass
    else:
        client.hand_off()  # returns only when the program is to start here, cold

try:  # course.probes imports only `os` until a probe is armed
    from course import probes
except ImportError:  # course is not importable here: nothing to install
    probes = None
if probes is not None:
    probes.install()

_here = os.path.dirname(os.path.abspath(__file__))
_others = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
