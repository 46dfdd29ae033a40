"""Lesson 09, exercise 6 - silent wrong results: runs that finish, and are wrong.

Run it:
    python lessons/09_debugging/silent.py        # two ranks; read what they report
    python -m course grade 09 -k silent          # grade your fixes

Nothing here raises. Each function below has one mistake that only shows in
numbers: the printout says which numbers to look at.
"""

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course import models, options, ranks
from course.runtime import exit_with_one_line


def epoch_order(dataset_size: int, epoch: int, seed: int = 0) -> list[int]:
    """The indices this rank visits in `epoch`, in order (a new shuffle every epoch)."""
    sampler = DistributedSampler(range(dataset_size), shuffle=True, seed=seed)
    # TODO: every epoch visits the shard in the same order. Make each epoch shuffle anew.
    pass
    return list(sampler)


def save_weights(model: DDP, path: str) -> None:
    """Save the trained weights so that a plain model (lesson 01's) can load them."""
    # TODO: two mistakes: every rank writes the same file, and the keys carry DDP's
    # "module." prefix, so lesson 01's model cannot load them.
    torch.save(model.state_dict(), path)


def accuracy(correct: int, total: int) -> float:
    """The test accuracy of the whole test set, from this rank's share (correct, total)."""
    # TODO: this is the accuracy of this rank's share only: rank 0 prints it as the
    # accuracy of the whole test set. Make every rank return the whole set's accuracy.
    return correct / total


def augmentation_generator(seed: int) -> torch.Generator:
    """The random numbers of this rank's data augmentation (noise, crops, dropout)."""
    # TODO: every rank draws the same augmentation, so the ranks' batches are less
    # different than they should be. Keep it reproducible, but different on each rank.
    return torch.Generator().manual_seed(seed)


def train_step(model: DDP, optimizer, images, labels) -> float:
    """One step of DDP on this rank's batch; returns its loss."""
    # TODO: the gradients are world_size times too small: DDP already averages them.
    loss = F.cross_entropy(model(images), labels) / dist.get_world_size()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def run(rank: int, world: int, port: int, folder: str) -> None:
    ranks.join_local(rank, world, "gloo", port)
    torch.manual_seed(0)
    model = DDP(models.SmallCNN(norm="none"))
    loss = train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), *_batch(rank))
    same_order = epoch_order(100, 0) == epoch_order(100, 1)
    acc = accuracy(90 - 30 * rank, 100)  # rank 0: 90 of 100 right, rank 1: 60 of 100
    same_noise = _same(augmentation_generator(0))
    mine = Path(folder, f"rank{rank}")  # each rank gets a folder of its own: who writes?
    mine.mkdir(parents=True, exist_ok=True)
    save_weights(model, str(mine / "weights.pt"))
    dist.barrier()
    if rank == 0:
        print(f"epochs 0 and 1 visit the shard in the same order: {same_order}")
        print(f"accuracy, rank 0 reports: {acc:.0%} (rank 0 has 90 of 100 right, rank 1 60)")
        print(f"augmentation noise identical on every rank: {same_noise}")
        print(f"loss of the first step: {loss:.4f} (an untrained 10-class model: ln 10 = 2.30)")
        wrote = [r for r in range(world) if Path(folder, f"rank{r}", "weights.pt").exists()]
        keys = list(torch.load(mine / "weights.pt", weights_only=True))[:2]
        print(f"ranks that wrote weights.pt: {wrote}; its first keys: {keys}")
        plain = list(models.SmallCNN(norm="none").state_dict())[:2]
        print(f"lesson 01's model expects: {plain}")
    dist.destroy_process_group()


def _batch(rank: int):
    gen = torch.Generator().manual_seed(rank)
    return torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)


def _same(gen: torch.Generator) -> bool:
    noise = torch.randn(4, generator=gen)
    gathered = [torch.empty(4) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, noise)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def main(argv=None):
    p = options.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", help="where the ranks save weights.pt (default: a temporary one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(run, args=(2, ranks.free_port(), args.folder or scratch), nprocs=2)


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
