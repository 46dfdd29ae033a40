"""Probes of the declared equivalents (tests/mutants/equivalents.py): an equivalent mutant is
run beside the reference, in this process, on inputs drawn from the domain its reason names,
and must answer the same, to the bit.

A probe covers functions of a solution file that need no process group: the reference and
the mutant are loaded from their source (the mutation record's line, its `before` replaced
by its `after`), the probe calls the covered functions of both on the same draws, and any
difference is the reason's counterexample. An equivalent outside a covered function (the
ring's hops, FSDP2's mesh) keeps its written reason only: `probed()` says which are which.
A probe is held to find something too: a mutant the grade kills in the same functions must
differ somewhere in its draws (tests/mutants/test_probes.py).

These load reference solutions only, never a submission: the grader never imports this.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import random
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "results" / "grading"
DRAWS = 100  # inputs a probe draws, from its own seed
DRAW_TIMEOUT_S = 5.0  # a mutant that loops forever answers nothing: a difference


def load(source: str, name: str):
    """A module from source text (a file of its own, registered while it runs: dataclasses
    read their module's namespace)."""
    folder = Path(tempfile.mkdtemp(prefix="probe-"))
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def mutated(source: str, mutant: dict) -> str:
    """`source` with the record's mutant applied: its line's `before` becomes `after`."""
    lines = source.splitlines(keepends=True)
    line = lines[mutant["line"] - 1]
    stripped = line.strip()
    if stripped != mutant["before"]:
        raise ValueError(f"{mutant['file']}:{mutant['line']} is {stripped!r}, the record says "
                         f"{mutant['before']!r}: the record is stale")  # fmt: skip
    indent = line[: len(line) - len(line.lstrip())]
    lines[mutant["line"] - 1] = indent + mutant["after"] + "\n"
    return "".join(lines)


def spans(source: str, names: tuple[str, ...]) -> list[range]:
    """The lines of the named top-level functions."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            found.append(range(node.lineno, node.end_lineno + 1))
    return found


def same(a, b) -> bool:
    """Equal to the bit: tensors by torch.equal (NaN where NaN), numbers and containers
    by value, recursively."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(torch.nan_to_num(a, nan=0.5), torch.nan_to_num(b, nan=0.5))
                and torch.equal(a.isnan(), b.isnan()))  # fmt: skip
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _answer(call: Callable):
    """What a call returns, or the kind of error it raises (an answer too)."""
    try:
        return call()
    except Exception as exc:  # a refusal is compared like a result
        return ("raises", type(exc).__name__)


# --- the probes: (lesson, file) -> covered functions and calls on drawn inputs ------------


def _plan_calls(m, r: random.Random) -> list:
    """plan.py's every function on a configuration its own check() accepts: among them
    shards some ranks get no row of, a search limit at its answer, and free communication
    with no vocabulary, where every tp ties (the grader's questions draw those too)."""
    tie = r.random() < 0.2
    while True:
        dim = r.choice([8, 64, 96, 128, 256, 512, 1024])
        model = m.Model(vocab=0 if tie else r.choice([3, 64, 512, 1000, 32000]), dim=dim,
                        depth=r.choice([1, 2, 3, 4, 6, 8, 12, 16, 32]),
                        seq=r.choice([16, 64, 128, 2048]),
                        hidden=r.choice([0, 0, 3 * dim, 6 * dim]))  # fmt: skip
        par = m.Parallel(pp=r.choice([1, 1, 2, 3, 4, 8]),
                         dp=r.choice([1, 2, 3, 4, 8, 16, 64, 128]), tp=r.choice([1, 2, 4, 8]),
                         batch=r.choice([8, 12, 16, 32, 48, 64, 256, 1024]),
                         micro_batches=r.choice([1, 2, 3, 4, 8]),
                         schedule=r.choice(["gpipe", "1f1b"]))  # fmt: skip
        try:
            m.check(model, par)
            break
        except ValueError:
            continue
    free = float("inf")
    hw = m.Hardware(memory=r.choice([2e9, 8e10]), flops=r.choice([1e11, 6.7e13, 1e15]),
                    efficiency=r.choice([1.0, 0.4]), gpus_per_node=r.choice([1, 2, 8]),
                    intra=free if tie else r.choice([5e9, 4.5e11]),
                    inter=free if tie else r.choice([1e9, 5e10]),
                    latency=0.0 if tie else r.choice([0.0, 1e-5, 1e-3]))  # fmt: skip
    calls = []
    for stage in range(par.pp):
        calls += [lambda s=stage: m.units(model, par, s), lambda s=stage: m.activations(model, par, s),
                  lambda s=stage: m.traffic(model, par, s)]  # fmt: skip
        for dp_rank in sorted({0, par.dp // 2, par.dp - 1}):
            calls.append(lambda s=stage, d=dp_rank: m.held(model, par, s, d))
    target = r.choice([0.5, 0.25, 0.1, 0.05])
    most = r.choice([1, 2, 4, 8, 64])
    calls += [lambda: m.rows(model, par), lambda: m.step_time(model, par, hw),
              lambda: m.memory(model, par), lambda: m.fits(model, par, hw),
              lambda: m.micro_batches_for(par.pp, target),
              lambda: m.communication_bound(model, par, hw, most=most),
              lambda: m.best_tp(model, par, hw)]  # fmt: skip
    return [_answer(call) for call in calls]


def _moe_calls(m, r: random.Random) -> list:
    """route, kept and balance_loss on a layer's tokens, skewed or not."""
    tokens, n, k = r.choice([1, 5, 24, 64]), r.choice([2, 4, 8]), r.choice([1, 2])
    g = torch.Generator().manual_seed(r.randrange(1 << 30))
    logits = torch.randn(tokens, n, generator=g, dtype=r.choice([torch.float32, torch.float64]))
    if r.random() < 0.5:
        logits[:, : max(1, n // 4)] += 3  # skewed towards the first experts
    probs, gates, experts = m.route(logits, k)
    cap = r.choice([1, 2, math.ceil(tokens * k / n), tokens])
    return [_answer(lambda: m.route(logits, k)), _answer(lambda: m.kept(experts, n, cap)),
            _answer(lambda: m.balance_loss(probs, experts, n))]  # fmt: skip


def _merge_calls(m, r: random.Random) -> list:
    """The online softmax's merge of two partial attentions, empty ones (lse -inf) among them."""
    g = torch.Generator().manual_seed(r.randrange(1 << 30))
    shape = (r.choice([1, 2]), r.choice([1, 4]), r.choice([1, 8, 16]))
    dtype = r.choice([torch.float32, torch.float64])
    out, block_out = (torch.randn(*shape, 8, generator=g, dtype=dtype) for _ in range(2))
    lse, block_lse = (torch.randn(*shape, 1, generator=g, dtype=dtype) * 20 for _ in range(2))
    lse[torch.rand(lse.shape, generator=g) < 0.3] = float("-inf")
    return [_answer(lambda: m.merge(out, lse, block_out, block_lse))]


def _hang_calls(m, r: random.Random) -> list:
    """diagnose and from_flight_records on 3 to 8 ranks, one out of step, as the lesson
    plants it: a skipped collective, or another at the same sequence number."""
    world, odd = r.randrange(3, 9), None
    odd = r.randrange(world)
    ops = {"all_reduce": "ALLREDUCE", "broadcast": "BROADCAST", "all_gather": "ALLGATHER"}
    missed = r.choice(list(ops))
    other = r.choice([op for op in ops if op != missed] + ["barrier"])
    messages = {}
    for rank in range(world):
        op = ops.get(other, "BARRIER") if rank == odd else ops[missed]
        peer = (rank + 1) % world
        messages[rank] = (f"Detected mismatch between collectives on ranks. Rank {rank} is "
                          f"running collective: CollectiveFingerPrint(SequenceNumber=3, "
                          f"OpType={op}, TensorShape=[1], TensorDtypes=Float), but Rank {peer} "
                          f"is running collective: CollectiveFingerPrint(SequenceNumber=3, "
                          f"OpType=REDUCE).")  # fmt: skip
    seq, backend = r.randrange(1, 9), r.choice(["gloo", "nccl"])
    records = {}
    kind = r.choice(["behind", "other", "empty"])
    for rank in range(world):
        entries = [{"collective_seq_id": s, "profiling_name": f"{backend}:all_reduce"}
                   for s in range(1, seq)]  # fmt: skip
        if rank != odd or kind == "other":
            name = missed if rank != odd else other
            entries.append({"collective_seq_id": seq, "profiling_name": f"{backend}:{name}"})
        if rank == odd and kind == "empty":
            entries = []
        records[rank] = entries
    if kind == "empty" and seq == 1:
        records[odd] = []
    return [_answer(lambda: m.diagnose(messages)), _answer(lambda: m.from_flight_records(records))]


PROBES: dict[tuple[str, str], tuple[tuple[str, ...], Callable]] = {
    ("15", "plan.py"): (("check", "stage_blocks", "units", "rows", "held", "activations",
                         "traffic", "bandwidth", "step_time", "memory", "fits",
                         "micro_batches_for", "communication_bound", "best_tp"), _plan_calls),
    ("13", "moe.py"): (("route", "kept", "balance_loss"), _moe_calls),
    ("12", "ring.py"): (("merge",), _merge_calls),
    ("09", "hang.py"): (("diagnose", "from_flight_records"), _hang_calls),
}  # fmt: skip


def record(lesson: str) -> dict:
    return json.loads((RECORDS / f"mutation-{lesson}.json").read_text())


def solution(lesson: str, file: str) -> Path:
    from course import registry

    return ROOT / "solutions" / registry.get(lesson).slug / file


def covered(lesson: str, mutant: dict) -> bool:
    """Whether a probe runs the function this mutant changes."""
    probe = PROBES.get((lesson, mutant["file"]))
    if probe is None:
        return False
    source = solution(lesson, mutant["file"]).read_text()
    return any(mutant["line"] in span for span in spans(source, probe[0]))


class _Hung(BaseException):  # not an answer: _answer() must not catch it
    pass


def _within(seconds: float, call: Callable):
    """call(), or _Hung once `seconds` pass (a mutated loop may never end)."""

    def stop(signum, frame):
        raise _Hung

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def differences(
    lesson: str, mutant: dict, draws: int = DRAWS, seed: int = 0, first: bool = False
) -> list[int]:
    """The draws (by index) on which the mutant answers otherwise than the reference (or
    not within DRAW_TIMEOUT_S: then no further draw is tried), up to the first if `first`."""
    names, calls = PROBES[(lesson, mutant["file"])]
    source = solution(lesson, mutant["file"]).read_text()
    stem = f"probe_{lesson}_{Path(mutant['file']).stem}"
    reference = load(source, f"{stem}_reference")
    changed = load(mutated(source, mutant), f"{stem}_mutant_{mutant['line']}")
    found = []
    for i in range(draws):
        ours = calls(reference, random.Random(seed * 100_003 + i))
        try:
            theirs = _within(
                DRAW_TIMEOUT_S, lambda i=i: calls(changed, random.Random(seed * 100_003 + i))
            )
        except _Hung:
            return [*found, i]
        if not same(ours, theirs):
            found.append(i)
            if first:
                break
    return found


def probed() -> dict[str, list[dict]]:
    """Every lesson's recorded equivalents that a probe covers."""
    found = {}
    for lesson, _ in PROBES:
        found.setdefault(lesson, [])
        for mutant in record(lesson)["mutants"]:
            if mutant.get("outcome") == "equivalent" and covered(lesson, mutant):
                found[lesson].append(mutant)
    return found
