"""Warm starts: every Python process a launch starts begins with torch already imported.

A lesson's rank does little work in the tests (a tiny model, a few steps) but pays
about 3 s of CPU for `import torch` and 3 s more for torch._dynamo, which the first
optimizer imports (torch 2.14.1, 2 cores, measured 2026-12-03). A torchrun launch of
two ranks starts three such processes; the suite starts hundreds.

So the process that launches (a grading, the suite's worker) starts one *zygote*:
an interpreter that imports torch, torch.distributed and torch._dynamo once, with the
launches' own environment, and then only forks. Every Python process of a launch
(the launcher, torchrun's workers, mp.spawn's children) starts as usual; its
sitecustomize (course/probes/_site) finds COURSE_WARM_SOCKET and calls `hand_off()`
before anything else runs. That *client* sends the zygote its command line,
environment, working folder, limits and open file descriptors. The zygote forks a
child, which takes them over, as the client would have been, and runs the program
(script, -m module or -c code); the client waits, forwards the signals it gets to the
child, and exits with the child's status (or dies of the same signal). The client is
what its launcher and the grader see: its pid, its process group, its command line.

The contract with course.launch: the child lives in a session of its own and dies
when its client dies (the zygote watches every client's socket and SIGKILLs that
child's group at once), or when the zygote dies (PR_SET_PDEATHSIG). The zygote is a
child of the launching process, so what the children leave behind is still among
that process's descendants (launch.kill_descendants, the grader's end of session).

Whenever a process could come out different, it is started cold instead: another
environment for what torch reads when imported (thread counts, TORCH_*, PYTHON*,
LD_*, the PYTHONPATH), other interpreter flags, -W or -X options, a program read from
stdin. Not the same as a fresh interpreter, and accepted: the hash seed of str is the
zygote's in every child (PYTHONHASHSEED set by the caller is honoured, cold).
Off where GPUs are present and visible (CUDA must never be forked mid-state; with
CUDA_VISIBLE_DEVICES="" a GPU box starts warm: protocol.allowed), with
COURSE_CHILD_USER (children switch user), and with COURSE_WARM_START=0. Also what a
warm child cannot hide: /proc/PID/cmdline shows the zygote's command, and a stack dump
(faulthandler, py-spy) shows the zygote's frames under the program's, so `course spy`
and the recordings that keep stacks start their processes cold.

An optional speed-up: with COURSE_WARM_START=0 every launch starts cold, and grades the
same. The parts, one module each:

    protocol   what a client and its zygote say to each other; which launches match
    client     hand_off(), the starting process's half (the sitecustomize calls it)
    zygote     serve(), the forking interpreter (python -m course.launch.warm.zygote)
    child      become(), what the zygote's fork does to turn into the client's program
    pool       the launching process's zygotes, one per environment; drain after a launch
"""
