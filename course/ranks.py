"""Small helpers that distributed lessons share: ports, timeouts, CPU shares, means.

They are plumbing, not the lesson: the lessons still call init_process_group,
mp.spawn and torchrun themselves.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import warnings
from datetime import timedelta

# Imported before any process group exists, on purpose. PyTorch's torch._dynamo, which the
# first DistributedDataParallel or torch.optim optimizer imports, keeps a reference to the
# default process group if one exists when it is imported (measured with 2.14.1: import it
# after init_process_group, and destroy_process_group() frees nothing). The group's gloo
# worker threads then live into interpreter shutdown, and one that lets go of a finished
# collective's tensors there needs the GIL, is ended by CPython, and aborts the process:
# "terminate called without an active exception", SIGABRT, exit -6 (seen in a core dump of
# lesson 10's fsdp.py, and in the course's CI in lessons 03, 07 and 10 under load).
# Imported here, before a lesson joins a group, it holds none.
import torch._dynamo  # noqa: F401, E402

# PyTorch 2.14 renamed the *_tensor collectives (reduce_scatter_tensor, all_gather_into_tensor:
# *_single); 2.8, the course container's, has only the old names: the lessons keep them,
# without 2.14's FutureWarning on every call.
warnings.filterwarnings("ignore", r"`torch\.distributed\.\w+_tensor` is deprecated", FutureWarning)


def say(*lines: str) -> None:
    """Print whole lines in one write. print() writes its text and then its newline, two
    writes on the unbuffered stdout a launch gives each rank; ranks that share a pipe can
    then splice their lines ("step 4/4: loss 2.4006stage 0: ..." and an empty line, seen
    in lesson 11's pipeline.py on two loaded cores)."""
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the OS for a port nobody is listening on.

    A hard-coded MASTER_PORT collides as soon as two jobs (or two tests) run
    on one machine; port 0 lets the kernel pick an unused one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_answers(addr: str, port: int) -> bool:
    """Whether something accepts a TCP connection at addr:port (within a second)."""
    try:
        socket.create_connection((addr, port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_until(deadline: float, ready) -> bool:
    """Poll ready() every 0.1 s until it is true (True) or time.monotonic() passes
    `deadline` (False): a silent wait with an exact end."""
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def no_per_step_buffer_sync() -> dict[str, bool]:
    """DDP's keyword for "do not re-send rank 0's buffers before every forward".

    PyTorch renamed it: `broadcast_buffers=False` (which also skips the sync at
    construction) is deprecated since 2.13, and `forward_sync_buffers=False` skips
    only the per-step sync (buffers are still made equal once, when DDP is built).
    Either way no collective per step."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def cpu_share(ranks_on_this_machine: int) -> int:
    """How many CPU threads one rank should use for its own CPU math.

    PyTorch starts one OpenMP thread per core in *every* process. N ranks on
    one machine then run N x cores threads that spin-wait for each other, and
    the CPU work of each step (collating, copying, launching kernels) crawls:
    on 2x H200 lesson 03 once ran several times slower on two GPUs than on
    one. So each rank takes its share of the cores. OMP_NUM_THREADS, when set
    (torchrun sets it to 1 for several ranks), wins: it is the user's choice.
    """
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, ranks_on_this_machine))


def backend_and_world_size(backend: str | None, nproc: int | None, sync_bn: bool = False):
    """(backend, ranks) for an mp.spawn lesson: nccl with one rank per GPU where CUDA
    works, else gloo with 2 CPU processes; ValueError for what cannot run here."""
    import torch.distributed as dist

    from course.runtime import visible_gpus

    gpus = visible_gpus()
    backend = backend or ("nccl" if gpus and dist.is_nccl_available() else "gloo")
    world_size = nproc or (gpus if backend == "nccl" else 2)
    if backend == "nccl" and gpus == 0:  # else 0 ranks: a run that does nothing, silently
        raise ValueError("--backend nccl needs CUDA GPUs and this machine has none: use gloo")
    if backend == "nccl" and world_size > gpus:
        raise ValueError(
            f"--backend nccl with {world_size} ranks needs {world_size} GPUs; "
            f"this machine has {gpus}"
        )
    if sync_bn and backend != "nccl":
        raise ValueError("--sync-bn needs --backend nccl: SyncBatchNorm runs on CUDA tensors only")
    return backend, world_size


def join_local(rank: int, world: int, backend: str, port: int):
    """Join a one-machine group of `world` ranks at 127.0.0.1:`port`; returns this rank's
    device. For the course's own tools, and for the lessons after 03 (whose setup() teaches
    these calls: choose the GPU, then join)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=process_group_timeout(),
    )
    return device


def mean_over_ranks(mean: float, count: int) -> tuple[float, int]:
    """(the mean over every rank's examples, their total count), from each rank's own
    mean and count: the ranks' sums and counts are all-reduced."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    totals = torch.tensor([mean * count, count], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    total, seen = totals.tolist()
    return (total / seen if seen else 0.0), int(seen)


def reduce_scatter_averages() -> bool:
    """Whether this group's reduce_scatter_tensor honours ReduceOp.AVG (one tiny collective;
    every rank must call it). PyTorch 2.8's gloo returns the *sum* instead, silently
    (measured: two ranks sending 1 and 2 received 3.0, where 2.14.1 gives 1.5; its
    all_reduce averages), and FSDP2 asks for AVG when it reduces in fp32 or bf16."""
    import warnings

    import torch
    import torch.distributed as dist

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    world = dist.get_world_size()
    out = torch.zeros(1, device=device)
    with warnings.catch_warnings():  # 2.14 renamed it reduce_scatter_single; 2.8 has this name
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(out, torch.ones(world, device=device), op=dist.ReduceOp.AVG)
    return out.item() == 1.0


def process_group_timeout() -> timedelta:
    """How long a collective may wait for the other ranks before it raises.

    PyTorch's default is 10 minutes (NCCL) or 30 minutes (gloo): far too long
    to notice a mistake while learning. COURSE_PG_TIMEOUT overrides it (seconds).
    """
    return timedelta(seconds=float(os.environ.get("COURSE_PG_TIMEOUT", "120")))


def from_environment() -> tuple[int, int, str, int]:
    """(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), read as torchrun sets them; a one-line
    ValueError that names what is missing or malformed (lesson 09's rendezvous.py)."""
    names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if missing := [name for name in names if not os.environ.get(name, "").strip()]:
        raise ValueError(
            f"{', '.join(missing)} not set: start each rank with RANK, WORLD_SIZE, "
            "MASTER_ADDR and MASTER_PORT in its environment (torchrun sets them)"
        )
    try:
        rank, world, port = (
            int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "MASTER_PORT")
        )
    except ValueError:
        shown = ", ".join(f"{n}={os.environ[n]!r}" for n in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
        raise ValueError(f"expected whole numbers, got {shown}") from None
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} with WORLD_SIZE={world}: a rank is 0 to WORLD_SIZE - 1")
    return rank, world, os.environ["MASTER_ADDR"], port


def require_torchrun(backend: str | None = None) -> str:
    """The backend for a torchrun lesson (as backend_and_world_size chooses it); a
    one-line error when started without torchrun, and a warning (rank 0) when
    restarts may fail to reconnect."""
    if "LOCAL_RANK" not in os.environ:
        raise ValueError("start me with torchrun: torchrun --standalone --nproc_per_node=2 ...")
    if os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1" and os.environ["RANK"] == "0":
        # torchrun's shared store can hand a restarted group the old attempt's
        # addresses (pytorch/pytorch#135712, #167288): restarts then fail to connect.
        print("warning: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for reliable restarts")
    return backend_and_world_size(backend, 1)[0]


def flight_records() -> list[dict]:
    """This process's flight recorder, oldest first: every collective it started on any
    group (gloo records too), each as {"collective_seq_id", "profiling_name" (such as
    "gloo:all_reduce"), "input_sizes", "state"}. Empty unless TORCH_FR_BUFFER_SIZE was set
    before the group was made (PyTorch 2.8 keeps none by default; 2.14.1, 2000)."""
    import pickle

    raw = torch._C._distributed_c10d._dump_fr_trace()
    keep = ("collective_seq_id", "profiling_name", "input_sizes", "state")
    return [{k: entry.get(k) for k in keep} for entry in pickle.loads(raw).get("entries", [])]


def _kept(rank: int, target, world: int, port: int, keep: str | None, folder: str) -> None:
    import json
    from pathlib import Path

    import torch
    import torch.distributed as dist

    torch.set_num_threads(cpu_share(world))
    join_local(rank, world, "gloo", port)
    try:
        target(rank, world)
    except Exception as err:
        if keep is None:
            raise
        kept = str(err) if keep == "message" else flight_records()
        Path(folder, f"{rank}.json").write_text(json.dumps(kept))
    finally:
        dist.destroy_process_group()


def spawn_gloo(target, world: int, timeout: float, keep: str | None = None) -> dict:
    """Run target(rank, world) in `world` gloo ranks on this machine, `timeout` seconds of
    process-group timeout. With `keep`, a rank whose target raises keeps what it knows
    instead of failing the job: "message" (its error, with TORCH_DISTRIBUTED_DEBUG=DETAIL's
    checks on) or "flight" (its flight recorder, on PyTorch 2.8 too). Returns {rank: what it
    kept}, empty when every rank finished."""
    import json
    import tempfile
    from pathlib import Path

    import torch.multiprocessing as mp

    os.environ["COURSE_PG_TIMEOUT"] = str(timeout)  # the ranks read both as they join
    if keep == "message":
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if keep == "flight":  # on by default since PyTorch 2.9; 2.8 keeps no entries
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    with tempfile.TemporaryDirectory() as folder:
        try:
            mp.spawn(_kept, args=(target, world, free_port(), keep, folder), nprocs=world)
        except mp.ProcessRaisedException:
            if keep is None:
                raise
        return {int(p.stem): json.loads(p.read_text()) for p in Path(folder).glob("*.json")}
