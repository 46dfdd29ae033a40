"""Lesson 09's exercises, called in a child process and in ranks forked from it.

Run by tests/lessons/test_09_debugging.py as `python lesson_09.py LESSON_FILE OUT_DIR`, where
LESSON_FILE is the lesson's oom.py; the other exercises are its neighbours (unused.py,
hang.py, silent.py). Every case returns what the exercise's functions produced, as
plain data and tensors; the test computes its own reference and compares. hang_fixed
runs last of the cases that fork ranks: a hang there would stop every later one
(Cases.spawn). memory_steps and unused_gradients run backward in this process, so they
come after every fork: where a GPU is visible, a fork of a process that has run backward
cannot run backward itself (autograd's device threads).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course import data, launch, memory, models, ranks
from course.grader import submission
from course.grader.cases import Cases, Tensors
from course.grader.tolerances import seed
from course.measure.draws import draw, shuffled

cases = Cases()
OOM_BATCH, OOM_MICRO, OOM_SMALL, OOM_STEPS, OOM_SEED = 1000, 128, 50, 3, seed(5)
DDP_SEED = seed(0)  # the silent DDP step's model; the test module has the same numbers
# A rank that waits in a collective its peers never join fails after this long. A correct
# exercise never waits long in one: every case passed with 1 s (twice, four busy loops
# on two cores, 2026-12-01). 5 s is five times that, stretched by COURSE_TIMEOUT_SCALE;
# it is also what a starter that hangs costs its grading (the lesson's 45 s budget).
PG_TIMEOUT_S = 5 * launch.timeout_scale()
COLLECTIVES = ("all_reduce", "broadcast", "all_gather")


def plants() -> list[tuple[int, int, str, str, list[int]]]:
    """The skips the diagnosis is asked about, drawn from the grading seed: one for each
    collective, in a drawn order, as (ranks, the rank that skips, the collective it skips,
    what that rank runs instead, the order of the messages diagnose is given). At least one
    has 4 ranks, and one's odd rank runs another collective, not the barrier after."""
    found = []
    for i, op in enumerate(shuffled("09.hang_ops", COLLECTIVES)):
        world = 4 if i == 0 else draw(f"09.hang_world{i}", (3, 4))
        skip = draw(f"09.hang_skip{i}", range(world))
        others = [c for c in COLLECTIVES if c != op]
        instead = draw(f"09.hang_instead{i}", others if i == 1 else ["barrier", *others])
        found.append((world, skip, op, instead, shuffled(f"09.hang_order{i}", range(world))))
    return found


def sibling(name: str, requires: tuple[str, ...]):
    return submission.load(cases.lesson_file.with_name(name), requires=requires)


def spawn(target, world: int, *args, what: str, ddp: bool = False) -> Path:
    out = cases.out / what.replace(" ", "-")
    out.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_PG_TIMEOUT"] = f"{PG_TIMEOUT_S:g}"  # the ranks read it as they join
    cases.spawn(target, world, str(out), *args, what=what, ddp=ddp)
    return out


# --- exercise 2: a parameter without a gradient, in ranks --------------------------


def _unused_rank(rank, world, port, out):
    module = sibling("unused.py", ("train",))
    ranks.join_local(rank, world, "gloo", port)
    try:
        state = module.train(rank, world, 3, 16)
        torch.save({k: v.detach().clone() for k, v in state.items()}, Path(out, f"{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@cases.case
def unused_ddp(lesson):
    """unused.train on 2 gloo ranks, 3 steps: each rank's weights afterwards."""
    out = spawn(_unused_rank, 2, what="unused ddp", ddp=True)
    got = {}
    for rank in range(2):
        for key, value in torch.load(Path(out, f"{rank}.pt"), weights_only=True).items():
            got[f"{rank}/{key}"] = value
    return Tensors(got)


# --- exercise 4: silent wrong results ---------------------------------------------------


def _silent_rank(rank, world, port, out, folders):
    from torch.nn.parallel import DistributedDataParallel as DDP

    module = sibling("silent.py", ("epoch_order", "save_weights", "accuracy"))
    ranks.join_local(rank, world, "gloo", port)
    try:
        found = {"orders": [module.epoch_order(102, e, seed=7) for e in (0, 1, 1)]}
        found["accuracy"] = float(module.accuracy(90 - 30 * rank, 100 + 20 * rank))
        streams = [module.augmentation_generator(seed) for seed in (0, 0, 1)]
        found["noise"] = [torch.randn(4, generator=g).tolist() for g in streams]
        torch.manual_seed(DDP_SEED)
        model = DDP(models.SmallCNN(norm="none"))
        gen = torch.Generator().manual_seed(rank)
        batch = torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        found["loss"] = float(module.train_step(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                *batch))  # fmt: skip
        module.save_weights(model, str(Path(folders[rank], "weights.pt")))
        torch.save(model.module.state_dict(), Path(out, f"{rank}.pt"))
        Path(out, f"{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@cases.case
def silent(lesson):
    """silent.py's five functions on 2 gloo ranks; rank r saves into a folder of its own."""
    folders = [cases.out / f"silent-rank{r}" for r in range(2)]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    out = spawn(_silent_rank, 2, [str(f) for f in folders], what="silent", ddp=True)
    found = [json.loads(Path(out, f"{rank}.json").read_text()) for rank in range(2)]
    written = {r: sorted(p.name for p in folders[r].iterdir()) for r in range(2)}
    tensors = {f"trained/{k}": v for k, v in torch.load(Path(out, "0.pt")).items()}
    saved = folders[0] / "weights.pt"
    if saved.is_file():
        tensors |= {f"saved/{k}": v for k, v in torch.load(saved, weights_only=True).items()}
    return Tensors(tensors, extra={"ranks": found, "written": written})


# --- exercise 3: a hang ----------------------------------------------------------------


def _plant(rank, world, port, out, skip, op, instead):
    """Every rank all-reduces; all but `skip` then call `op`, and `skip` calls `instead`
    (the barrier every rank calls next, or another collective)."""
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # as TORCH_DISTRIBUTED_DEBUG=DETAIL does
    ranks.join_local(rank, world, "gloo", port)
    t, message = torch.ones(3), ""
    try:
        dist.all_reduce(t)
        which = op if rank != skip else instead
        if which == "all_reduce":
            dist.all_reduce(t)
        elif which == "broadcast":
            dist.broadcast(t, src=(skip + 1) % world)
        elif which == "all_gather":
            dist.all_gather([torch.empty(3) for _ in range(world)], t)
        dist.barrier()
    except RuntimeError as err:
        message = str(err)
    finally:
        Path(out, f"{rank}.txt").write_text(message)
        dist.destroy_process_group()


@cases.case
def hang_diagnosis(lesson):
    """hang.diagnose on the messages of real runs with a skip planted (plants()), given
    in a drawn order of ranks."""
    module = sibling("hang.py", ("train", "diagnose"))
    answers, planted = [], plants()
    for world, skip, op, instead, order in planted:
        out = spawn(_plant, world, skip, op, instead, what=f"plant {world} {skip} {op}")
        messages = {rank: Path(out, f"{rank}.txt").read_text() for rank in order}
        if not all(messages.values()):
            raise RuntimeError(f"the planted skip raised on no rank: {messages}")
        rank, collective = module.diagnose(messages)
        answers.append([int(rank), str(collective)])
    return {"answers": answers, "plants": [list(p) for p in planted]}


# A planted flight-recorder hang waits for the process-group timeout once, in the ranks
# stuck in the planted collective: 2 s, as every deadline stretched by COURSE_TIMEOUT_SCALE.
# The collectives before it run after a barrier, so a rank slow to start on a busy machine
# delays them instead of timing them out; a run whose records show otherwise is run again
# with PG_TIMEOUT_S (fr_records).
FR_TIMEOUT_S = 2 * launch.timeout_scale()


def fr_plants() -> list[tuple[int, int, str, str, str, int]]:
    """The hangs the flight-recorder reader is asked about, drawn from the grading seed:
    (ranks, the odd rank, "behind" (it never calls the collective the others wait in) or
    "instead" (it calls another), the others' collective, the odd rank's, how many of the
    others' collective every rank runs before). One of each kind, in a drawn order."""
    found = []
    for i, how in enumerate(shuffled("09.fr_how", ("behind", "instead"))):
        world = draw(f"09.fr_world{i}", (3, 4))
        op = draw(f"09.fr_op{i}", COLLECTIVES)
        others = ["barrier", *(c for c in COLLECTIVES if c != op)]
        instead = draw(f"09.fr_instead{i}", others) if how == "instead" else ""
        found.append((world, draw(f"09.fr_odd{i}", range(world)), how, op, instead,
                      draw(f"09.fr_before{i}", (1, 2, 4))))  # fmt: skip
    return found


def _collective(which: str, t: torch.Tensor, world: int, src: int) -> None:
    if which == "all_reduce":
        dist.all_reduce(t)
    elif which == "broadcast":
        dist.broadcast(t, src=src)
    elif which == "all_gather":
        dist.all_gather([torch.empty_like(t) for _ in range(world)], t)
    elif which == "barrier":
        dist.barrier()


def _fr_rank(rank, world, port, out, odd, how, op, instead, before):
    """A barrier, `before` of the others' collective, then the planted one; each rank writes its
    flight recorder once it is stuck (the timeout, or a peer gone)."""
    ranks.join_local(rank, world, "gloo", port)
    t = torch.ones(3)
    try:
        dist.barrier()  # every rank is here: what follows runs together
        for _ in range(before):  # the same op: a rank behind differs only in its count
            _collective(op, t, world, (odd + 1) % world)
        if rank != odd:
            _collective(op, t, world, (odd + 1) % world)
        elif how == "instead":
            _collective(instead, t, world, (odd + 1) % world)
    except RuntimeError:
        pass  # the timeout, or a peer that left: what the reader is given is below
    finally:
        Path(out, f"{rank}.json").write_text(json.dumps(ranks.flight_records()))
        if rank == odd and how == "behind":
            time.sleep(FR_TIMEOUT_S)  # it stays, stuck elsewhere, while the others time out
        dist.destroy_process_group()


@cases.case
def hang_flight_records(lesson):
    """hang.from_flight_records on the flight recorders of real hangs planted on gloo ranks
    (fr_plants()), each rank's entries as ranks.flight_records() gives them."""
    module = sibling("hang.py", ("train", "from_flight_records"))
    try:  # a starter's TODO fails at once, before the planted hangs cost their timeouts
        module.from_flight_records({0: [], 1: [], 2: []})
    except NotImplementedError as err:
        if "TODO at" in str(err):
            raise
    except Exception:  # noqa: BLE001 - an answer to no hang at all is not graded
        pass
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"  # PyTorch 2.8 keeps none by default
    answers, planted = [], fr_plants()
    for world, odd, how, op, instead, before in planted:
        for timeout in (FR_TIMEOUT_S, PG_TIMEOUT_S):
            os.environ["COURSE_PG_TIMEOUT"] = f"{timeout:g}"
            out = cases.out / f"fr-{world}-{odd}-{how}-{timeout:g}"
            out.mkdir(parents=True, exist_ok=True)
            cases.spawn(_fr_rank, world, str(out), odd, how, op, instead, before,
                        what=f"flight recorder {world} {odd} {how}")  # fmt: skip
            records = {r: json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)}
            # as planted: a barrier, `before` collectives, then the planted one
            full = before + 2 - (how == "behind")
            if all(len(records[r]) == (full if r == odd else before + 2) for r in records):
                break
        else:
            raise RuntimeError(f"the planted hang did not record as planted: {records}")
        rank, collective = module.from_flight_records(records)
        answers.append([int(rank), str(collective)])
    return {"answers": answers, "plants": [list(p) for p in planted]}


def _hang_rank(rank, world, port, out):
    module = sibling("hang.py", ("train", "diagnose"))
    ranks.join_local(rank, world, "gloo", port)
    try:
        state, steps = module.train(rank, world, 32)
        torch.save({"steps": torch.tensor(int(steps)), **state}, Path(out, f"{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@cases.case
def hang_fixed(lesson):
    """hang.train on 3 gloo ranks (hand-cut shards of 480, 480 and 478 digits)."""
    out = spawn(_hang_rank, 3, what="hang train")
    got = {}
    for rank in range(3):
        for key, value in torch.load(Path(out, f"{rank}.pt"), weights_only=True).items():
            got[f"{rank}/{key}"] = value
    return Tensors(got)


# --- exercises 1 and 2 in this process, after every forked case (see the docstring) ----


@cases.case
def memory_steps(lesson):
    """OOM_STEPS steps of train_step on one batch of OOM_BATCH digits, OOM_MICRO at a time,
    each measured by this script's own meter; then one step at OOM_SMALL images."""
    images, labels = (t[:OOM_BATCH] for t in data.digits()[0].tensors)
    torch.manual_seed(OOM_SEED)
    model = models.SmallCNN(norm="none")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    peaks, losses = [], []
    for _ in range(OOM_STEPS):
        with memory.SavedTensors(model) as meter:
            losses.append(float(lesson.train_step(model, optimizer, images, labels, OOM_MICRO)))
        peaks.append(meter.peak)
    small = models.SmallCNN(norm="none")
    with memory.SavedTensors(small) as meter:
        lesson.train_step(small, torch.optim.SGD(small.parameters(), lr=0.05), images, labels,
                          OOM_SMALL)  # fmt: skip
    extra = {"peaks": peaks, "losses": losses, "small_peak": meter.peak}
    return Tensors(dict(model.state_dict()), extra=extra)


@cases.case
def unused_gradients(lesson):
    """Names of the parameters of unused.Net() that one backward leaves without a gradient,
    and of those whose gradient is zero everywhere (a layer used with weight zero)."""
    module = sibling("unused.py", ("train",))
    model = module.Net()
    images, labels = (t[:16] for t in data.digits()[0].tensors)
    F.cross_entropy(model(images), labels).backward()
    named = list(model.named_parameters())
    return {"missing": [n for n, p in named if p.grad is None], "all": [n for n, _ in named],
            "zero": [n for n, p in named if p.grad is not None and not p.grad.any()]}  # fmt: skip


if __name__ == "__main__":
    cases.run(requires=("train_step",))
