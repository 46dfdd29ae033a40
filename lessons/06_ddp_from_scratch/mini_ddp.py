"""Lesson 06 - DDP from scratch: MiniDDP averages gradients in buckets, during backward.

Run it:
    python lessons/06_ddp_from_scratch/mini_ddp.py --nproc 2 --backend gloo   # 2 CPU ranks
    python lessons/06_ddp_from_scratch/mini_ddp.py --backend nccl             # one rank per GPU
    python lessons/06_ddp_from_scratch/mini_ddp.py --wrapper torch            # torch's DDP
    python -m course grade 06                                                 # grade your version
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course import checkpoint, data, metrics, models, options, ranks
from course.runtime import exit_with_one_line


def parse_args(argv=None):
    p = options.parser(__doc__, prog="mini_ddp.py", per="per rank")
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--wrapper", choices=("mini", "torch"), default="mini", help="MiniDDP or DDP")
    p.add_argument(
        "--bucket-cap-mb", type=options.non_negative_float, default=25.0, help="0: one per tensor"
    )
    return options.parse(p, argv)


# --8<-- [start:mini_ddp]
class MiniDDP(nn.Module):
    """DistributedDataParallel's core in a page: same start, averaged gradients.

    Call finish_gradient_synchronization() after backward() and before the optimizer
    step. bucket_cap_mb=None sends one all-reduce per parameter."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float | None = None):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        # TODO: start every rank from rank 0's weights and buffers (each rank built its own
        # random model): the same start plus the same averaged step keeps replicas equal.
        raise NotImplementedError("TODO at 06_ddp_from_scratch/mini_ddp.py:50 is not done yet")
        # --8<-- [start:buckets]
        # Gradients arrive roughly from the last layer to the first: buckets in that order.
        # parameters() lists a shared (tied) weight once; frozen ones get no gradient.
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.buckets: list[list[nn.Parameter]] = []
        # TODO: group `trainable`, in reverse order, into self.buckets: lists of parameters
        # of about bucket_cap_mb megabytes each (None: one parameter per bucket). Fewer,
        # larger messages: each collective has a fixed cost, whatever its size.
        raise NotImplementedError("TODO at 06_ddp_from_scratch/mini_ddp.py:59 is not done yet")
        # --8<-- [end:buckets]
        self._arrived = [0] * len(self.buckets)  # gradients ready, per bucket
        self._next = 0  # the next bucket to send: every rank sends them in the same order
        self._pending = []  # (work, flat, params) of the all-reduces in flight
        for index, bucket in enumerate(self.buckets):
            for param in bucket:
                # Runs during backward, once param.grad holds this step's whole gradient.
                param.register_post_accumulate_grad_hook(lambda _, i=index: self._ready(i))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _ready(self, index: int) -> None:
        self._arrived[index] += 1
        while self._next < len(self.buckets) and self._arrived[self._next] == len(
            self.buckets[self._next]
        ):
            bucket = self.buckets[self._next]
            self._next += 1
            # TODO: start the all-reduce of this bucket's gradients and return at once:
            # backward goes on computing earlier layers' gradients while they travel.
            raise NotImplementedError("TODO at 06_ddp_from_scratch/mini_ddp.py:81 is not done yet")

    def finish_gradient_synchronization(self) -> None:
        """Wait for this step's all-reduces and put the averages in .grad."""
        if self._next < len(self.buckets):  # every rank raises: none waits for the others
            missing = [p.shape for b in self.buckets[self._next :] for p in b if p.grad is None]
            raise RuntimeError(
                f"MiniDDP: no gradient this step for parameters of shapes {missing}"
                if missing
                else f"MiniDDP: {self._next} of {len(self.buckets)} buckets were sent, though "
                "every parameter has a gradient: the gradients counted per bucket are wrong, "
                "or were not reset after the last step"
            )
        # TODO: wait for every pending all-reduce, then copy each averaged flat tensor
        # back into its parameters' .grad, and get ready for the next step.
        raise NotImplementedError("TODO at 06_ddp_from_scratch/mini_ddp.py:96 is not done yet")


# --8<-- [end:mini_ddp]


# --8<-- [start:train]
def train(rank: int, world_size: int, device: torch.device, args) -> None:
    torch.manual_seed(args.seed + rank)  # other weights on every rank: the wrapper aligns them
    train_set, test_set, classes, channels = data.build_datasets(
        args.data, args.data_dir, args.image_size, device
    )
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = data.loader(train_set, args.batch_size, device, args.num_workers, sampler=sampler)
    test_loader = data.loader(test_set, args.batch_size, device, args.num_workers)
    model = models.build_model(args.model, classes, channels, args.norm)
    model = model.to(device, memory_format=args.memory_format)
    if args.wrapper == "torch":  # the real one, to compare: same buckets, same step
        gpu = [device.index] if device.type == "cuda" else None
        options = dict(bucket_cap_mb=args.bucket_cap_mb, **ranks.no_per_step_buffer_sync())
        model = DDP(model, device_ids=gpu, **options)
    else:
        model = MiniDDP(model, bucket_cap_mb=args.bucket_cap_mb or None)  # 0: per tensor
        print(f"MiniDDP: {sum(map(len, model.buckets))} gradients, {len(model.buckets)} bucket(s)")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    log, step = metrics.RunLog(args, world_size=world_size, wrapper=args.wrapper), 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        tic, total, seen, first = time.perf_counter(), torch.zeros((), device=device), 0, step
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # MiniDDP's hooks start the all-reduces while backward runs
            if isinstance(model, MiniDDP):
                model.finish_gradient_synchronization()  # the averages, before the step
            optimizer.step()
            total, seen, step = total + loss.detach() * len(labels), seen + len(labels), step + 1
            if step == args.max_steps:
                break
        seconds = time.perf_counter() - tic
        train_loss, seen = ranks.mean_over_ranks((total / max(seen, 1)).item(), seen)
        if rank == 0:
            test_loss, accuracy = metrics.evaluate(model.module, test_loader, device)
            steps = step - first
            log.epoch(epoch + 1, train_loss, test_loss, accuracy, seen, seconds, steps, True)
        if step == args.max_steps:
            break
    if rank == 0:
        log.finish(metrics.evaluate(model.module, test_loader, device)[1], step)
        if args.checkpoint:
            checkpoint.save({"model": model.module.state_dict(), "step": step}, args.checkpoint)


# --8<-- [end:train]


def worker(rank: int, world_size: int, backend: str, port: int, args) -> None:
    if rank != 0:  # one voice: rank 0 prints
        sys.stdout = open(os.devnull, "w")
    torch.set_num_threads(ranks.cpu_share(world_size))
    device = ranks.join_local(rank, world_size, backend, port)  # as lesson 03's setup()
    try:
        train(rank, world_size, device, args)
        dist.barrier()  # leave together; rank 0's checkpoint is complete
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world_size = ranks.backend_and_world_size(args.backend, args.nproc)
    mp.spawn(worker, args=(world_size, backend, ranks.free_port(), args), nprocs=world_size)


if __name__ == "__main__":
    # A wrong flag prints one line and exits 2; a bug still shows its traceback.
    sys.exit(exit_with_one_line(main))
