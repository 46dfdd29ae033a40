"""What `python -m course record` records: each page's output blocks, as commands (lessons
00 to 09 here, and the Recording each is; 10 on in recordings_late.py).

A Recording names a script (the reference, or a broken starter of lesson 09), its
arguments and environment, and what the page says it shows; course/tools/author/record.py runs
them and keeps their outputs, and tests/site/test_recorded_outputs.py runs them again.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from course import REPO_ROOT, registry

TORCHRUN = ("--standalone", "--nproc_per_node=2")


@dataclass(frozen=True)
class Recording:
    name: str
    script: str  # relative to solutions/
    args: tuple[str, ...]
    what: str
    torchrun: tuple[str, ...] = ()  # torchrun's own options: launched by torchrun
    env: tuple[tuple[str, str], ...] = ()
    ordered: bool = True  # False: several processes print, the lines' order varies
    starter: bool = False  # run lessons/ (lesson 09: the broken script), not solutions/
    exit_code: int = 0  # what the command must exit with (a broken starter's failure)
    keep: str | None = None  # a regular expression: only the lines it matches are kept
    clock: bool = False  # run under `python -m course clock` (steps and data wait)
    spy: bool = False  # run under `python -m course spy` (each stuck rank's stack; py-spy)
    verb: str = ""  # a course command of its own (`python -m course VERB ARGS`), no script
    # The same script run first with these arguments, in the same folder, its output not
    # kept: what the recorded command starts from (a checkpoint to resume, say).
    before: tuple[str, ...] = ()
    # GPUs it runs on (0: the CPU). `course record` makes it only where that many are
    # visible, and the suite checks it only there.
    gpus: int = 0

    @property
    def stacks(self) -> bool:
        """Its output shows call stacks (py-spy's, faulthandler's): those of a process
        started warm would show the zygote's frames too (course/launch/warm/)."""
        return self.spy or bool(self.keep and "File" in self.keep)

    def before_command(self) -> list[str]:
        return [*self.command()[: -len(self.args) or None], *self.before]

    def command(self) -> list[str]:
        script = str(REPO_ROOT / ("lessons" if self.starter else "solutions") / self.script)
        if self.torchrun:
            return [*registry.torchrun(script, *self.torchrun), *self.args]
        if self.verb:
            return [sys.executable, "-m", "course", self.verb, *self.args]
        if self.clock or self.spy:
            verb = "clock" if self.clock else "spy"
            return [sys.executable, "-m", "course", verb, script, *self.args]
        return [sys.executable, script, *self.args]

    def shown(self) -> str:
        """The command as a page shows it (the starter's path: what a student runs)."""
        launcher = ["torchrun", *self.torchrun] if self.torchrun else ["python"]
        launcher = ["python", "-m", "course", "clock"] if self.clock else launcher
        launcher = ["python", "-m", "course", "spy"] if self.spy else launcher
        env = [f"{k}={v}" for k, v in self.env]
        if self.verb:
            return " ".join([*env, "python", "-m", "course", self.verb, *self.args])
        return " ".join([*env, *launcher, f"lessons/{self.script}", *self.args])


# rendezvous.py's settings for a rank that finds nobody: nothing listens at this port (below
# the ports the OS hands out, 32768 and up; the other record of rendezvous.py uses 29532).
RANK_1_ALONE = (
    ("MASTER_ADDR", "127.0.0.1"),
    ("MASTER_PORT", "29531"),
    ("RANK", "1"),
    ("WORLD_SIZE", "2"),
)

EARLY = (
    Recording(
        "01_cpu",
        "01_single_device/train.py",
        ("--device", "cpu", "--epochs", "3"),
        "lesson 01, the default 3 epochs on the CPU",
    ),
    Recording(
        "01_cpu_10",
        "01_single_device/train.py",
        ("--device", "cpu", "--epochs", "10", "--quiet"),
        "lesson 01, 10 epochs on the CPU",
    ),
    Recording(
        "02_cpu",
        "02_data_parallel/train_dp.py",
        ("--device", "cpu", "--epochs", "1"),
        "lesson 02 on a machine without GPUs: the plain model, one epoch",
    ),
    Recording(
        "03_gloo",
        "03_ddp_spawn/train.py",
        ("--nproc", "2", "--backend", "gloo", "--epochs", "3"),
        "lesson 03, two gloo ranks on the CPU",
    ),
    Recording(
        "04_kill",
        "04_torchrun/train.py",
        ("--backend", "gloo", "--snapshot", "snap.pt", "--snapshot-every", "4")
        + ("--epochs", "2", "--batch-size", "128"),
        "lesson 04: rank 1 killed after step 7, torchrun restarts the group once",
        torchrun=(*TORCHRUN, "--max-restarts=1"),
        env=(("COURSE_KILL_RANK", "1"), ("COURSE_KILL_AT_STEP", "7")),
        ordered=False,
    ),
    Recording(
        "08_compile",
        "08_performance/train.py",
        ("--nproc", "2", "--backend", "gloo", "--max-steps", "5", "--compile"),
        "lesson 08 with --compile, two gloo ranks: what torch.compile made of the DDP model",
        keep=r"^(training|torch\.compile)",
    ),
    Recording(
        "09_oom",
        "09_debugging/oom.py",
        (),
        "lesson 09's broken oom.py: the whole batch at once",
        starter=True,
        exit_code=1,
    ),
    Recording(
        "09_oom_big",
        "09_debugging/oom.py",
        ("--budget-mb", "64", "--steps", "2"),
        "lesson 09's broken oom.py with a budget the whole batch fits in",
        starter=True,
    ),
    Recording(
        "09_oom_fixed",
        "09_debugging/oom.py",
        ("--steps", "2"),
        "lesson 09's oom.py, fixed: 128 images per forward and backward",
    ),
    Recording(
        "09_oom_big_gpu",
        "09_debugging/oom.py",
        ("--budget-mb", "64", "--steps", "2", "--device", "cuda"),
        "lesson 09's broken oom.py on a GPU, with a budget the whole batch fits in",
        starter=True,
        gpus=1,
    ),
    Recording(
        "09_oom_fixed_gpu",
        "09_debugging/oom.py",
        ("--steps", "2", "--device", "cuda"),
        "lesson 09's oom.py, fixed, on a GPU: 128 images per forward and backward",
        gpus=1,
    ),
    Recording(
        "09_unused",
        "09_debugging/unused.py",
        (),
        "lesson 09's broken unused.py with TORCH_DISTRIBUTED_DEBUG=INFO (the error's key lines)",
        env=(("TORCH_DISTRIBUTED_DEBUG", "INFO"),),
        starter=True,
        exit_code=1,
        keep=r"^(step \d|RuntimeError|Parameters which|Parameter indices)",
    ),
    Recording(
        "09_find_unused",
        "",
        (),
        "lesson 09, what DDP's find_unused_parameters=True costs a step of the fixed model",
        verb="find-unused",
    ),
    Recording(
        "09_find_unused_gpu",
        "",
        ("--device", "cuda"),
        "lesson 09, what find_unused_parameters=True costs a step of the fixed model on a GPU",
        verb="find-unused",
        gpus=1,
    ),
    Recording(
        "09_hang_spy",
        "09_debugging/hang.py",
        ("--timeout", "60"),  # stuck for a minute: time to look, on a loaded machine too
        "lesson 09's broken hang.py under py-spy: where each rank waits",
        starter=True,
        spy=True,
    ),
    Recording(
        "09_hang_detail",
        "09_debugging/hang.py",
        ("--diagnose", "--timeout", "5"),
        "lesson 09's broken hang.py under DETAIL: every rank's whole message, before diagnose()",
        starter=True,
        exit_code=1,
    ),
    Recording(
        "09_hang_flight",
        "09_debugging/hang.py",
        ("--flight-recorder", "--timeout", "5"),
        "lesson 09's broken hang.py: each rank's flight recorder after the timeout (gloo)",
        starter=True,
        exit_code=1,
    ),
    Recording(
        "09_rendezvous",
        "09_debugging/rendezvous.py",
        ("--give-up", "8"),
        "lesson 09's broken rendezvous.py, rank 1 alone: nobody at MASTER_ADDR:MASTER_PORT",
        env=RANK_1_ALONE,
        starter=True,
        exit_code=1,
        keep=r"^(Timeout|Thread|  File)",
    ),
    Recording(
        "09_rendezvous_fixed",
        "09_debugging/rendezvous.py",
        ("--timeout", "3"),
        "lesson 09's rendezvous.py, fixed, rank 1 alone",
        env=RANK_1_ALONE,
        exit_code=2,
    ),
    Recording(
        "09_rendezvous_interface",
        "09_debugging/rendezvous.py",
        (),
        "lesson 09's broken rendezvous.py with GLOO_SOCKET_IFNAME naming no interface",
        env=(
            ("GLOO_SOCKET_IFNAME", "nope0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29532"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ),
        starter=True,
        exit_code=1,
        keep=r"^RuntimeError",
    ),
    Recording(
        "09_starved",
        "09_debugging/starved.py",
        (),
        "lesson 09's broken starved.py under the step clock: no workers",
        starter=True,
        clock=True,
        keep=r"^(epoch|clock)",
    ),
    Recording(
        "09_starved_fixed",
        "09_debugging/starved.py",
        (),
        "lesson 09's starved.py, fixed, under the step clock: 4 workers",
        clock=True,
        keep=r"^(epoch|clock)",
    ),
    Recording(
        "09_silent",
        "09_debugging/silent.py",
        (),
        "lesson 09's broken silent.py: five mistakes, no error",
        starter=True,
    ),
    Recording(
        "09_silent_fixed",
        "09_debugging/silent.py",
        (),
        "lesson 09's silent.py, fixed",
    ),
)
