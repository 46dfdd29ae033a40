"""Lesson 00 - environment check: what can this machine train with?

    python lessons/00_environment/env_check.py            # run your version
    python lessons/00_environment/env_check.py --smoke 2  # + a 2-process all-reduce
    python -m course grade 00                             # grade your version
    python -m course doctor                               # the reference report

In the course container with GPUs: `docker compose run --rm course python -m course doctor`.

Before writing any multi-GPU code, answer four questions: which PyTorch is
this, how many GPUs does this process see, which communication libraries did
this build ship with, and so which backend and which device should each rank
use? Every later lesson calls `pick_backend` and `device_for` the way you
write them here.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course.ranks import free_port, process_group_timeout


# --8<-- [start:device_count]
def cuda_device_count() -> int:
    """How many CUDA GPUs this process can use (0 when CUDA is unusable)."""
    # TODO: return how many CUDA GPUs this process can really use. A build can list
    # devices it cannot use (no driver, a driver too old for the build,
    # CUDA_VISIBLE_DEVICES=""), and every later lesson sizes its job by this number, so a
    # GPU that cannot run a kernel must count as none.
    # HINT 1: Two questions to PyTorch: is CUDA usable at all, and if so, how many
    #   devices are there?
    # HINT 2: torch.cuda.is_available() answers the first, torch.cuda.device_count() the
    #   second. Call them through `torch.cuda` (not `from torch.cuda import ...`): the
    #   grader simulates GPU machines by replacing those two functions.
    # HINT 3: if not torch.cuda.is_available(): return 0, else return
    #   torch.cuda.device_count().
    ### BEGIN SOLUTION
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()
    ### END SOLUTION


# --8<-- [end:device_count]


# --8<-- [start:libraries]
def library_report() -> dict:
    """Versions and availability of the libraries distributed training needs."""
    cuda_ok = cuda_device_count() > 0
    # TODO: fill in which communication libraries this build has, and their versions (None
    # when a library is absent). When a multi-GPU job fails, the first question is which
    # NCCL and cuDNN it ran with; this report answers it.
    # HINT 1: Each key has a PyTorch function that answers it; the versions only make
    #   sense when the library is there.
    # HINT 2: torch.backends.cudnn.is_available() / .version(); dist.is_available() with
    #   dist.is_nccl_available() and dist.is_gloo_available(); torch.cuda.nccl.version()
    #   (a tuple, and it needs CUDA: only ask when `cuda_ok`).
    # HINT 3: cudnn_version = torch.backends.cudnn.version() if cudnn_available else
    #   None; nccl_version = ".".join(str(p) for p in torch.cuda.nccl.version()) if
    #   nccl_available and cuda_ok else None.
    ### BEGIN SOLUTION
    cudnn_available = torch.backends.cudnn.is_available()
    nccl_available = dist.is_available() and dist.is_nccl_available()
    nccl_version = None
    if nccl_available and cuda_ok:
        nccl_version = ".".join(str(part) for part in torch.cuda.nccl.version())
    report = {
        "cudnn_available": cudnn_available,
        "cudnn_version": torch.backends.cudnn.version() if cudnn_available else None,
        "nccl_available": nccl_available,
        "nccl_version": nccl_version,
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
    }
    ### END SOLUTION
    return {
        "torch_version": torch.__version__,
        "cuda_build": torch.version.cuda,  # the CUDA version torch was built for, or None
        "cuda_usable": cuda_ok,
        "gpu_count": cuda_device_count(),
        **report,
    }


# --8<-- [end:libraries]


# --8<-- [start:backend]
def pick_backend() -> str:
    """The process-group backend to use here: "nccl" or "gloo"."""
    # TODO: choose the process-group backend for this machine. NCCL moves CUDA tensors
    # between GPUs at NVLink speed but cannot move CPU tensors at all; gloo runs
    # everywhere. So NCCL only when it can work: a usable GPU and a build that has it.
    # HINT 1: Two conditions must both hold for "nccl"; anything else is "gloo".
    # HINT 2: Use your cuda_device_count() (it already says 0 when CUDA is unusable) and
    #   dist.is_nccl_available() (guarded by dist.is_available()).
    # HINT 3: return "nccl" if cuda_device_count() > 0 and dist.is_available() and
    #   dist.is_nccl_available() else "gloo".
    ### BEGIN SOLUTION
    if cuda_device_count() > 0 and dist.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"
    ### END SOLUTION


def device_for(local_rank: int) -> torch.device:
    """The device a process with this local rank should train on."""
    # TODO: give each process its own device: a GPU of its own when there are GPUs, the
    # CPU otherwise (CPU ranks can share it). Refuse, with a ValueError that says why, a
    # local rank that has no GPU: two ranks on one GPU is a silent slowdown at best and an
    # NCCL error at worst.
    # HINT 1: The local rank numbers the processes on this machine from 0; it maps one
    #   to one onto the GPUs. Three cases: a negative rank, no GPUs, a rank beyond the
    #   last GPU.
    # HINT 2: torch.device("cpu") and torch.device("cuda", local_rank); the GPU count is
    #   cuda_device_count().
    # HINT 3: raise ValueError if local_rank < 0; return cpu if there are no GPUs; raise
    #   ValueError if local_rank >= the count; else return torch.device("cuda",
    #   local_rank).
    ### BEGIN SOLUTION
    if local_rank < 0:
        raise ValueError(f"local rank must be >= 0, got {local_rank}")
    gpus = cuda_device_count()
    if gpus == 0:
        return torch.device("cpu")
    if local_rank >= gpus:
        raise ValueError(f"local rank {local_rank} has no GPU: only {gpus} are visible")
    return torch.device("cuda", local_rank)
    ### END SOLUTION


# --8<-- [end:backend]


# --8<-- [start:smoke]
def _smoke_worker(rank: int, world_size: int, port: int, backend: str) -> None:
    # A preview of lesson 03: every rank contributes rank+1, and an all-reduce
    # must hand every rank the same sum. If this works, the backend can talk.
    device = device_for(rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init: NCCL binds to the current device
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=process_group_timeout(),
    )
    try:
        value = torch.tensor([float(rank + 1)], device=device)
        dist.all_reduce(value)
        expected = world_size * (world_size + 1) / 2
        if value.item() != expected:
            raise RuntimeError(f"rank {rank}: all-reduce gave {value.item()}, expected {expected}")
        # One write per line: ranks share the terminal and would interleave.
        sys.stdout.write(
            f"rank {rank}/{world_size} on {device}: all-reduce sum {value.item():g} ok\n"
        )
        # Leave together: a rank that tears down while another is still in a
        # collective can abort it (gloo's "terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def smoke_test(world_size: int, backend: str) -> None:
    """Start `world_size` local processes and all-reduce one number across them."""
    mp.spawn(_smoke_worker, args=(world_size, free_port(), backend), nprocs=world_size)


# --8<-- [end:smoke]


def print_report(report: dict, backend: str, device: torch.device) -> None:
    yes = {True: "yes", False: "no"}
    print("Environment check")
    print(f"  PyTorch            {report['torch_version']}")
    print(f"  built for CUDA     {report['cuda_build'] or 'no (CPU-only build)'}")
    print(f"  CUDA usable        {yes[report['cuda_usable']]}")
    for index in range(report["gpu_count"]):
        props = torch.cuda.get_device_properties(index)
        print(f"    cuda:{index}  {props.name}, {props.total_memory / 2**30:.0f} GiB")
    print(f"  cuDNN              {yes[report['cudnn_available']]} {report['cudnn_version'] or '-'}")
    print(f"  NCCL               {yes[report['nccl_available']]} {report['nccl_version'] or '-'}")
    print(f"  gloo               {yes[report['gloo_available']]}")
    print(f"  backend to use     {backend}")
    print(f"  device for rank 0  {device}")
    print(f"How many GPUs does this process see? {report['gpu_count']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--smoke", type=int, default=0, metavar="N", help="also all-reduce across N processes"
    )
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="backend for --smoke")
    args = parser.parse_args(argv)
    report = library_report()
    backend = args.backend or pick_backend()
    if args.json:
        print(json.dumps({**report, "backend": backend, "device": str(device_for(0))}))
    else:
        print_report(report, backend, device_for(0))
    if args.smoke:
        if backend == "nccl" and args.smoke > report["gpu_count"]:
            parser.error(f"--smoke {args.smoke} with nccl needs {args.smoke} GPUs")
        smoke_test(args.smoke, backend)
        print(f"smoke test passed: {args.smoke} processes, backend {backend}")


if __name__ == "__main__":
    main()
