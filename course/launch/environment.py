"""What every child starts with: its environment, its user and its resource limits."""

from __future__ import annotations

import os
from pathlib import Path

from course import REPO_ROOT

SITE_DIR = Path(__file__).parent.parent / "probes" / "_site"

# Each rank writes its output to <dir>/rank<N>.log when this is set (see
# course/probes/rank_output.py), so a hang can be blamed on a rank.
RANK_LOG_ENV = "COURSE_RANK_LOG_DIR"
# The child writes when it finished importing torch here (course/probes/__init__.py).
READY_ENV = "COURSE_READY_LOG"
# The optional warm start's (launch/warm/): the socket of the zygote a launch's Python
# processes hand themselves to, and the launch they belong to. Named here, where every
# child's environment is made: a launch's child never inherits its parent's.
WARM_SOCKET_ENV = "COURSE_WARM_SOCKET"
WARM_LAUNCH_ENV = "COURSE_WARM_LAUNCH"

# One thread per rank: several ranks on two cores otherwise fight over them.
QUIET_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

# NVLink multicast (NVLS) can take a shared GPU host down; keep it off in
# every process we start, whatever the caller's environment says.
SAFE_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


CHILD_USER_ENV = "COURSE_CHILD_USER"


def child_user(*folders: str | Path | None) -> dict:
    """Popen's user/group options when the grader runs as root with COURSE_CHILD_USER set.

    In the course container the `grade` service grades as root and sets
    COURSE_CHILD_USER=runner: every child then runs as that unprivileged
    user, who cannot write the results file, the grader's code or the
    reference solutions, nor signal the grader. The child's working folders
    are handed to that user. Elsewhere (a laptop, CI as an ordinary user)
    children run as the grader's own user: see docs/threat-model.md."""
    name = os.environ.get(CHILD_USER_ENV)
    if not name or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return {}
    import pwd

    entry = pwd.getpwnam(name)  # KeyError: a user that does not exist is a setup error
    for folder in folders:
        if folder is None or not Path(folder).exists():
            continue
        folder = Path(folder).resolve()
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        for parent in folder.parents:  # e.g. pytest's /tmp/pytest-of-root is 0700:
            mode = parent.stat().st_mode  # let the child pass through (not list) it
            if not mode & 0o001:
                os.chmod(parent, (mode & 0o7777) | 0o001)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


# Limits every child runs under: no core dumps, and no file larger than
# this (a runaway writer fills no disk). CPU time is bounded by each run's
# deadline, which kills the whole group.
FILE_SIZE_LIMIT = 4 << 30


def limit(pid: int) -> None:
    """Apply the children's resource limits to a just-started process (inherited by
    everything it starts later)."""
    import resource

    if not hasattr(resource, "prlimit"):
        return
    for what, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT)):
        try:
            soft, hard = resource.prlimit(pid, what)
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.prlimit(pid, what, (cap, hard))
        except (OSError, ValueError):
            pass


# torchrun's agent shares its rendezvous store with the workers by default,
# and a restarted group can then read the previous attempt's addresses and
# fail to connect ("Connection refused" in gloo or NCCL; pytorch/pytorch#135712,
# #167288). With this set, every attempt gets a fresh store.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def child_env(
    extra: dict[str, str | None] | None = None,
    one_thread: bool = True,
    course_root: str | Path | None = None,
) -> dict[str, str]:
    """The environment for a child: the caller's, plus the course's settings.

    one_thread=False leaves the thread count to the child, as a student's
    shell would: `course run` and `course bench` launch lessons that way, so
    a lesson that forgets to share the CPU between its ranks shows it.
    """
    threads = QUIET_ENV if one_thread else {"PYTHONUNBUFFERED": "1"}
    env = {**os.environ, **threads, **ELASTIC_ENV, **(extra or {}), **SAFE_GPU_ENV}
    env = {key: value for key, value in env.items() if value is not None}  # None: unset it
    # The caller's pytest options (a --junitxml for the suite, say) are not the grade's:
    # a nested grading gets only the options its command line gives.
    env.pop("PYTEST_ADDOPTS", None)
    env.pop(WARM_SOCKET_ENV, None)  # `run` gives a launch its own zygote, or none
    env.pop(WARM_LAUNCH_ENV, None)
    for key in [key for key in env if key.startswith("PYTEST_XDIST_")]:
        del env[key]  # a child is never the suite's xdist worker (see can_fork)
    # The lesson scripts import `course`; make that work for a student folder
    # anywhere on disk and on machines where the package is not pip-installed.
    # SITE_DIR's sitecustomize installs the grader's probes (course/probes/__init__.py),
    # armed only by their COURSE_* variables.
    # course_root: another copy of the course (a class deployment without solutions/)
    # whose grader the child runs: its `course` must come first, and this one's not at all,
    # or the sitecustomize on this one's path would import this course before the other.
    root = Path(course_root) if course_root is not None else REPO_ROOT
    ours = {str(REPO_ROOT), str(SITE_DIR)}
    paths = [str(root), str(root / "course" / "probes" / "_site")]
    paths += (p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env
