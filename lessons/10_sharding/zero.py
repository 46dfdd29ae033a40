"""Lesson 10 - sharding, part 1: ShardedOptimizer (ZeRO stage 1) keeps 1/N of Adam's state.

Run it:
    python lessons/10_sharding/zero.py --nproc 2 --backend gloo    # 2 CPU ranks
    python lessons/10_sharding/zero.py --optimizer plain           # AdamW whole on every rank
    python lessons/10_sharding/zero.py --optimizer torch           # PyTorch's ZeRO-1
    python -m course grade 10                                      # grade your version
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course import checkpoint, data, metrics, models, options, ranks
from course.runtime import exit_with_one_line


def parse_args(argv=None):
    p = options.parser(__doc__, prog="zero.py", per="per rank")
    p.set_defaults(lr=1e-2)  # AdamW's step for this small CNN (SGD's default is 0.05)
    p.add_argument("--nproc", type=options.positive_int, help="ranks (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--optimizer", choices=("sharded", "plain", "torch"), default="sharded")
    return options.parse(p, argv)


# --8<-- [start:sharded]
class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: every rank holds every parameter, but only its own shard's optimizer
    state, and steps only that shard; then each shard's owner sends it to the others.

    ShardedOptimizer(params, optimizer_cls, **kwargs) takes what optimizer_cls takes
    (parameter groups included). state_dict() and load_state_dict() speak the unsharded
    optimizer's format, so a checkpoint loads into either; both are collectives: call them
    on every rank."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.owner: dict[torch.Tensor, int] = {}  # parameter -> the rank that steps it
        self.owned_bytes = [0] * self.world
        self.local, self._make_local = None, lambda groups: optimizer_cls(groups, **kwargs)
        super().__init__(params, defaults=kwargs)  # calls add_param_group for each group

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)  # checks it and fills in the defaults
        group = self.param_groups[-1]
        # TODO: give each new parameter an owner, balancing the bytes each rank steps, and
        # hand this rank's share of the group (same hyperparameters) to self.local.
        raise NotImplementedError("TODO at 10_sharding/zero.py:56 is not done yet")
        # optimizer_cls filled in its defaults (AdamW: betas, eps...): keep them here too,
        # where schedulers and state_dict() read them.
        group.update({k: v for k, v in self.local.param_groups[-1].items() if k != "params"})

    @torch.no_grad()
    def step(self, closure=None):
        # A scheduler changes self.param_groups' hyperparameters: pass them on first.
        for group, mine in zip(self.param_groups, self.local.param_groups, strict=True):
            mine.update({k: v for k, v in group.items() if k != "params"})
        loss = self.local.step(closure)
        # TODO: after this rank's step, every rank must hold every updated parameter.
        raise NotImplementedError("TODO at 10_sharding/zero.py:68 is not done yet")
        return loss

    def _order(self) -> list[torch.Tensor]:
        """Every parameter once, in the order of self.param_groups: the index state_dict uses."""
        return list(dict.fromkeys(p for group in self.param_groups for p in group["params"]))

    def state_dict(self) -> dict:
        local = self.local.state_dict()
        mine = [p for group in self.local.param_groups for p in group["params"]]
        index = {p: i for i, p in enumerate(self._order())}
        # TODO: the unsharded optimizer's state_dict, on every rank: each rank's entries,
        # re-numbered by the global order (index), gathered from all ranks.
        raise NotImplementedError("TODO at 10_sharding/zero.py:81 is not done yet")
        groups = super().state_dict()["param_groups"]  # hyperparameters, global indices
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Keep this rank's entries of an unsharded state_dict (from state_dict() or torch's
        own optimizer), and the hyperparameters of every group."""
        order = self._order()
        mine = [p for group in self.local.param_groups for p in group["params"]]
        position = {p: i for i, p in enumerate(mine)}
        state = {
            position[order[i]]: s for i, s in state_dict["state"].items() if order[i] in position
        }
        groups = []
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
            kept = [position[order[i]] for i in saved["params"] if order[i] in position]
            groups.append({**saved, "params": kept})
        self.local.load_state_dict({"state": state, "param_groups": groups})


# --8<-- [end:sharded]


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in this rank's optimizer state (AdamW: two per parameter)."""
    inner = getattr(optimizer, "local", getattr(optimizer, "optim", optimizer))  # the shard's
    tensors = [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


# --8<-- [start:train]
def train(rank: int, world_size: int, device: torch.device, args) -> None:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    train_set, test_set, classes, channels = data.build_datasets(
        args.data, args.data_dir, args.image_size, device
    )
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = data.loader(train_set, args.batch_size, device, args.num_workers, sampler=sampler)
    test_loader = data.loader(test_set, args.batch_size, device, args.num_workers)
    model = models.build_model(args.model, classes, channels, args.norm).to(device)
    gpu = [device.index] if device.type == "cuda" else None
    model = DDP(model, device_ids=gpu, **ranks.no_per_step_buffer_sync())  # averages gradients
    # Weight decay on weights, none on biases and norms: two parameter groups.
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    if args.optimizer == "sharded":
        optimizer = ShardedOptimizer(groups, torch.optim.AdamW, lr=args.lr)
    elif args.optimizer == "torch":  # PyTorch's own ZeRO stage 1, for comparison
        optimizer = ZeroRedundancyOptimizer(groups, torch.optim.AdamW, lr=args.lr)
    else:
        optimizer = torch.optim.AdamW(groups, lr=args.lr)
    log, step = metrics.RunLog(args, world_size=world_size, optimizer=args.optimizer), 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        tic, total, seen, first = time.perf_counter(), torch.zeros((), device=device), 0, step
        for images, labels in loader:
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, seen, step = total + loss.detach() * len(labels), seen + len(labels), step + 1
            if step == args.max_steps:
                break
        if epoch == 0:  # Adam's state exists after the first step
            held = torch.zeros(world_size, dtype=torch.long, device=device)
            held[rank] = state_bytes(optimizer)
            dist.all_reduce(held)  # every rank's count, on every rank
            whole = held.sum().item()
            for r, mine in enumerate(held.tolist() if rank == 0 else []):
                print(f"rank {r}: optimizer state {mine:,} bytes of {whole:,} ({mine / whole:.0%})")
        train_loss, seen = ranks.mean_over_ranks((total / max(seen, 1)).item(), seen)
        if rank == 0:
            test_loss, accuracy = metrics.evaluate(model.module, test_loader, device)
            log.epoch(epoch + 1, train_loss, test_loss, accuracy, seen, time.perf_counter() - tic,
                      step - first, True)  # fmt: skip
        if step == args.max_steps:
            break
    if rank == 0:
        log.finish(metrics.evaluate(model.module, test_loader, device)[1], step)
        if args.checkpoint:
            checkpoint.save({"model": model.module.state_dict(), "step": step}, args.checkpoint)


# --8<-- [end:train]


def worker(rank: int, world_size: int, backend: str, port: int, args) -> None:
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
