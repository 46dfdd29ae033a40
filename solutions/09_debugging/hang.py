"""Lesson 09, exercise 3 - a hang: one rank leaves the loop early, the others wait for it.

Run it:
    python lessons/09_debugging/hang.py              # stuck until the process-group timeout
    python lessons/09_debugging/hang.py --diagnose   # with DETAIL checks, then diagnose()
    python lessons/09_debugging/hang.py --flight-recorder --timeout 5   # read after the hang
    python -m course grade 09 -k hang                # grade your diagnosis and your fix
"""

import re
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course import data, models, options, ranks
from course.runtime import exit_with_one_line, seed_everything


def parse_args(argv=None):
    p = options.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, default=3, help="gloo ranks (default 3)")
    p.add_argument("--timeout", type=options.positive_float, default=15, help="group timeout (s)")
    p.add_argument("--diagnose", action="store_true", help="run with DETAIL checks, diagnose")
    p.add_argument("--flight-recorder", action="store_true",
                   help="after the timeout, read each rank's flight recorder")  # fmt: skip
    return p.parse_args(argv)


def train(rank: int, world: int, batch_size: int = 32) -> tuple[dict, int]:
    """One pass over this rank's shard, gradients averaged over the ranks; returns (the
    weights, the steps taken)."""
    seed_everything(0)
    model = models.SmallCNN(norm="none")  # the same weights everywhere: the same seed
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images, labels = data.digits()[0].tensors
    per = -(-len(labels) // world)  # shards cut by hand: ceil(N / world), the last one shorter
    images, labels = images[rank * per : (rank + 1) * per], labels[rank * per : (rank + 1) * per]
    # TODO: each rank counts the steps its own shard holds, and the last shard is shorter:
    # that rank leaves the loop while the others wait for it in the next all-reduce. Make
    # every rank take the same number of steps.
    # HINT 1: the ranks must agree on one number before the loop: a collective.
    # HINT 2: all-reduce the count with ReduceOp.MIN (every rank takes the shortest shard's
    #   steps). DistributedSampler (which pads the shards to one length) or DDP's join()
    #   context manager would work too.
    ### BEGIN BUG
    #| steps = len(labels) // batch_size
    ### FIX
    steps = torch.tensor([len(labels) // batch_size])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)  # the shortest shard's count, on every rank
    steps = int(steps)
    ### END BUG
    for step in range(steps):
        batch = slice(step * batch_size, (step + 1) * batch_size)
        loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for param in model.parameters():  # the mean gradient, as DDP makes it (lesson 06):
            dist.all_reduce(param.grad)  # every rank must be here, every step
            param.grad /= world
        optimizer.step()
    dist.barrier()  # everyone finished training: evaluate together
    return model.state_dict(), steps


# The collective names TORCH_DISTRIBUTED_DEBUG=DETAIL writes, as torch.distributed's functions.
# (BROADCAST, BARRIER and the others are the function's name in capitals.)
OP_NAMES = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "ALLTOALL": "all_to_all"}


def diagnose(messages: dict[int, str]) -> tuple[int, str]:
    """From each rank's error under TORCH_DISTRIBUTED_DEBUG=DETAIL ({rank: message}, three
    ranks or more): (the rank out of step with the others, the collective that rank
    missed, as its torch.distributed name: "all_reduce", "broadcast", ...)."""
    # TODO: each message starts with what its own rank was running ("Rank 2 is running
    # collective: CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, ..."). The
    # rank whose collective differs from the others' diverged; what the others run is
    # the collective it missed.
    # HINT 1: read only the first fingerprint of each message: the op after "but Rank N"
    #   is the other rank's fingerprint length read as an op (REDUCE, GATHER), no clue.
    # HINT 2: a regular expression finds the first "Rank (\d+) is running collective" and
    #   the "OpType=(\w+)" after it. The op most ranks run is the missed one; the rank
    #   that runs another is the one out of step.
    ### BEGIN SOLUTION
    own = {}  # rank -> the collective it runs: the first fingerprint of its message
    for message in messages.values():
        found = re.search(r"Rank (\d+) is running collective: [^)]*?OpType=(\w+)", message)
        if found:
            own[int(found.group(1))] = found.group(2)
    ops = list(own.values())
    common = max(set(ops), key=ops.count)  # what most ranks run: the missed collective
    odd = [rank for rank, op in own.items() if op != common]
    return odd[0], OP_NAMES.get(common, common.lower())
    ### END SOLUTION


def from_flight_records(records: dict[int, list[dict]]) -> tuple[int, str]:
    """From each rank's flight recorder after a hang ({rank: its entries, oldest first},
    three ranks or more; each entry has "collective_seq_id" and "profiling_name", such as
    "gloo:all_reduce"): (the rank out of step, the collective the others wait in, as its
    torch.distributed name)."""
    # TODO: a rank's last entry is the collective it is stuck in. The others agree on one
    # (the same sequence number, the same op); the rank out of step either never got there
    # (its last sequence number is behind) or waits in another op at the same number.
    # HINT 1: for each rank, (the last entry's collective_seq_id, its profiling_name after
    #   the "gloo:" or "nccl:"), and (0, "") for a rank with no entries at all.
    # HINT 2: the pair most ranks share is the others'; the rank whose pair differs is the
    #   one out of step. collections.Counter(pairs).most_common(1).
    ### BEGIN SOLUTION
    last = {rank: (0, "") for rank in records}  # a rank that never started a collective
    for rank, entries in records.items():
        if entries:
            last[rank] = (entries[-1]["collective_seq_id"], entries[-1]["profiling_name"])
    common, _ = Counter(last.values()).most_common(1)[0]  # what most ranks are stuck in
    odd = [rank for rank, pair in last.items() if pair != common]
    return odd[0], common[1].split(":")[-1]
    ### END SOLUTION


def worker(rank: int, world: int) -> None:
    _, steps = train(rank, world)
    ranks.say(f"rank {rank}: {steps} steps")


def main(argv=None):
    args = parse_args(argv)
    keep = "message" if args.diagnose else "flight" if args.flight_recorder else None
    kept = ranks.spawn_gloo(worker, args.nproc, args.timeout, keep)  # {rank: what it kept}
    for rank in sorted(kept):  # whole: what diagnose() or from_flight_records() reads
        if args.diagnose:
            print(f"rank {rank}: {' '.join(kept[rank].split())}")
        else:
            last = [(e["collective_seq_id"], e["profiling_name"]) for e in kept[rank][-2:]]
            print(f"rank {rank}: {len(kept[rank])} collectives, the last two {last}")
    if kept:
        rank, missed = diagnose(kept) if args.diagnose else from_flight_records(kept)
        how = "diagnosis" if args.diagnose else "flight recorder"
        print(f"{how}: rank {rank} is out of step; the others wait in {missed}")
        return 1
    print("done: every rank took the same number of steps")


if __name__ == "__main__":
    raise SystemExit(exit_with_one_line(main))
