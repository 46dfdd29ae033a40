"""Lesson 11 - model parallelism, part 1: a pipeline, one stage of the model per rank.

Run it:
    python lessons/11_model_parallel/pipeline.py --nproc 2 --backend gloo    # GPipe, 2 stages
    python lessons/11_model_parallel/pipeline.py --schedule 1f1b --micro-batches 8
    python lessons/11_model_parallel/pipeline.py --schedule torch-1f1b       # PyTorch's own
    python lessons/11_model_parallel/pipeline.py --stage-ms 10               # measure the bubble
    python -m course grade 11                                                # grade your version
"""

import statistics
import sys
from collections import deque

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from course import data, models, options, ranks
from course.runtime import exit_with_one_line
from course.stages import Watched, bubble

VOCAB = 64
SCHEDULES = ("gpipe", "1f1b", "torch-gpipe", "torch-1f1b")


def parse_args(argv=None):
    p = options.ArgumentParser(prog="pipeline.py", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=options.positive_int, help="stages (default: GPUs, or 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl if CUDA works")
    p.add_argument("--schedule", choices=SCHEDULES, default="gpipe")
    p.add_argument("--micro-batches", type=options.positive_int, default=4)
    p.add_argument("--batch-size", type=options.positive_int, default=32, help="whole batch")
    p.add_argument("--dim", type=options.positive_int, default=64, help="model width")
    p.add_argument("--depth", type=options.positive_int, default=4, help="blocks, all stages")
    p.add_argument("--steps", type=options.positive_int, default=60)
    p.add_argument("--seed", type=int, default=0, help="the initial weights' seed")
    p.add_argument("--stage-ms", type=options.non_negative_float, default=0.0,
                   help="a controlled cost: each stage's forward also waits this long, its "
                   "backward twice as long (to measure the bubble)")  # fmt: skip
    args = p.parse_args(argv)
    if args.batch_size % args.micro_batches:
        p.error(f"--batch-size {args.batch_size} is not a multiple of --micro-batches")
    return args


def build_stage(rank: int, world: int, dim: int, depth: int, seed: int = 0) -> nn.Sequential:
    """Stage `rank` of `world`. Every rank builds the whole model from one seed (the
    weights one process would have), then keeps its own slice of the blocks; the first
    stage also keeps the embedding, the last the final norm and the output head."""
    torch.manual_seed(seed)  # (main() has checked that every stage gets a block)
    layers = [nn.Embedding(VOCAB, dim), *(models.Block(dim) for _ in range(depth))]
    layers += [nn.LayerNorm(dim), nn.Linear(dim, VOCAB)]
    cuts = [1 + depth * r // world for r in range(world + 1)]  # block r's first layer
    cuts[0], cuts[-1] = 0, len(layers)
    return nn.Sequential(*layers[cuts[rank] : cuts[rank + 1]])


class Pipe:
    """One stage's view of the pipeline: its module, its neighbours, and point-to-point
    messages to them. Sends are asynchronous (isend): a stage sending an activation forward
    while its neighbour sends a gradient back would otherwise each wait for the other.
    finish() waits for every send."""

    def __init__(self, stage: nn.Module, rank: int, world: int, shape, device):
        self.stage, self.rank, self.world = stage, rank, world
        self.shape, self.device = tuple(shape), device  # one micro-batch's activation
        self.first, self.last = rank == 0, rank == world - 1
        self.sends, self.losses = [], []

    def recv_forward(self) -> torch.Tensor:
        x = torch.empty(self.shape, device=self.device)
        dist.recv(x, src=self.rank - 1)
        return x

    def send_forward(self, y: torch.Tensor) -> None:
        self.sends.append(dist.isend(y.detach(), dst=self.rank + 1))

    def recv_backward(self) -> torch.Tensor:
        grad = torch.empty(self.shape, device=self.device)
        dist.recv(grad, src=self.rank + 1)
        return grad

    def send_backward(self, grad: torch.Tensor) -> None:
        self.sends.append(dist.isend(grad, dst=self.rank - 1))

    def finish(self) -> torch.Tensor | None:
        """Wait for every send; the step's loss on the last stage, None on the others."""
        for work in self.sends:
            work.wait()
        loss = sum(self.losses) if self.last else None
        self.sends, self.losses = [], []
        return loss


# --8<-- [start:steps]
def forward_step(pipe: Pipe, tokens, targets, micro_batches: int):
    """One micro-batch forward through this stage: returns (input, output), what its
    backward needs. On the last stage the output is the micro-batch's loss, divided by
    micro_batches (the step's loss is then their sum, the whole batch's mean)."""
    # TODO: take the input (the tokens on the first stage, else the previous stage's
    # activation), run the stage, then send the activation on, or make the loss.
    # HINT 1: The received activation is where this stage's backward ends: it must
    #   collect a gradient to send back, so it has to require one.
    # HINT 2: x = tokens if pipe.first else pipe.recv_forward().requires_grad_();
    #   y = pipe.stage(x); on the last stage y = F.cross_entropy(y.flatten(0, 1),
    #   targets.flatten()) / micro_batches, else pipe.send_forward(y).
    ### BEGIN SOLUTION
    x = tokens if pipe.first else pipe.recv_forward().requires_grad_()
    y = pipe.stage(x)
    if pipe.last:
        y = F.cross_entropy(y.flatten(0, 1), targets.flatten()) / micro_batches
    else:
        pipe.send_forward(y)
    ### END SOLUTION
    if pipe.last:
        pipe.losses.append(y.detach())
    return x, y


def backward_step(pipe: Pipe, x: torch.Tensor, y: torch.Tensor) -> None:
    """One micro-batch backward through this stage, from its loss (last stage) or from
    the gradient the next stage sends; the input's gradient goes to the previous stage."""
    # TODO: backward from y, then send the input's gradient back (not from the first stage).
    # HINT 1: A non-scalar output needs the gradient of the loss with respect to it: the
    #   one the next stage computed for its own input.
    # HINT 2: y.backward() on the last stage, else y.backward(pipe.recv_backward()); then,
    #   except on the first stage, pipe.send_backward(x.grad).
    ### BEGIN SOLUTION
    y.backward() if pipe.last else y.backward(pipe.recv_backward())
    if not pipe.first:
        pipe.send_backward(x.grad)
    ### END SOLUTION


def gpipe(pipe: Pipe, inputs: list, targets: list) -> torch.Tensor | None:
    """GPipe: every micro-batch forward, then every one backward. Returns the loss (last
    stage) or None."""
    # TODO: run forward_step for each micro-batch, keeping what it returns; then
    # backward_step for each, in the same order.
    # HINT 1: All m micro-batches' activations are alive at once, between the two loops:
    #   GPipe's memory cost.
    # HINT 2: saved = [forward_step(pipe, inputs[i], targets[i], len(inputs)) for i in
    #   range(len(inputs))], then backward_step(pipe, x, y) for x, y in saved.
    ### BEGIN SOLUTION
    saved = [forward_step(pipe, inputs[i], targets[i], len(inputs)) for i in range(len(inputs))]
    for x, y in saved:
        backward_step(pipe, x, y)
    ### END SOLUTION
    return pipe.finish()


def one_f_one_b(pipe: Pipe, inputs: list, targets: list) -> torch.Tensor | None:
    """1F1B: a few forwards to fill the pipeline, then one forward and one backward in
    turn, then the backwards left. Stage r keeps at most (stages - r) micro-batches of
    activations, whatever the number of micro-batches."""
    m = len(inputs)
    # TODO: warm up with the forwards that fill the stages after this one, then alternate
    # one forward with the oldest micro-batch's backward, then finish the backwards.
    # HINT 1: Stage r's first backward needs micro-batch 0's gradient, which comes back
    #   after the (world - r - 1) later stages have run it: that many forwards first.
    # HINT 2: warmup = min(pipe.world - pipe.rank - 1, m); saved = deque(); forwards for
    #   i < warmup; for i in range(warmup, m): saved.append(forward_step(...)) then
    #   backward_step(pipe, *saved.popleft()); while saved: backward_step(...).
    ### BEGIN SOLUTION
    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()
    for i in range(warmup):
        saved.append(forward_step(pipe, inputs[i], targets[i], m))
    for i in range(warmup, m):
        saved.append(forward_step(pipe, inputs[i], targets[i], m))
        backward_step(pipe, *saved.popleft())
    while saved:
        backward_step(pipe, *saved.popleft())
    ### END SOLUTION
    return pipe.finish()


# --8<-- [end:steps]


# --8<-- [start:torch]
def torch_schedule(stage: nn.Module, pipe: Pipe, name: str, micro_batches: int):
    """PyTorch's pipeline (torch.distributed.pipelining) over the same stage module:
    ScheduleGPipe for torch-gpipe, Schedule1F1B for torch-1f1b."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    def loss_fn(logits, targets):  # per micro-batch; the schedule averages the gradients
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    # TODO: wrap the module in a PipelineStage (this rank's stage of pipe.world), and make
    # the schedule `name` asks for over micro_batches, with loss_fn.
    # HINT 1: A PipelineStage knows its index, the number of stages and its device; it
    #   finds the activations' shapes itself at the first step.
    # HINT 2: PipelineStage(stage, pipe.rank, pipe.world, pipe.device), then
    #   (ScheduleGPipe if name == "torch-gpipe" else Schedule1F1B)(that, micro_batches,
    #   loss_fn=loss_fn).
    ### BEGIN SOLUTION
    wrapped = PipelineStage(stage, pipe.rank, pipe.world, pipe.device)
    schedule = ScheduleGPipe if name == "torch-gpipe" else Schedule1F1B
    return schedule(wrapped, micro_batches, loss_fn=loss_fn)
    ### END SOLUTION


# --8<-- [end:torch]


def worker(rank: int, world: int, backend: str, port: int, args) -> None:
    torch.set_num_threads(ranks.cpu_share(world))
    device = ranks.join_local(rank, world, backend, port)
    try:
        stage = build_stage(rank, world, args.dim, args.depth, args.seed)
        watched = Watched(stage, args.stage_ms / 1e3).to(device)
        m, size = args.micro_batches, args.batch_size // args.micro_batches
        pipe = Pipe(watched, rank, world, (size, 16, args.dim), device)  # 16 tokens a row
        optimizer = torch.optim.AdamW(watched.parameters(), lr=3e-3)
        if args.schedule.startswith("torch"):
            schedule = torch_schedule(watched, pipe, args.schedule, m)
        bubbles = []
        for step in range(1, args.steps + 1):
            tokens, targets = (t.to(device) for t in data.lookup_tokens(step, 0, m * size, VOCAB))
            watched.busy.clear()
            if args.schedule == "gpipe":
                loss = gpipe(pipe, tokens.chunk(m), targets.chunk(m))
            elif args.schedule == "1f1b":
                loss = one_f_one_b(pipe, tokens.chunk(m), targets.chunk(m))
            else:  # the first stage gives the inputs, the last the targets
                losses = []
                kwargs = dict(target=targets, losses=losses) if pipe.last else {}
                schedule.step(*([tokens] if pipe.first else []), **kwargs)
                loss = torch.stack(losses).mean() if pipe.last else None
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step == 1:  # torch's first step also runs each stage once to learn shapes
                watched.alive = watched.most_alive = 0
            if args.stage_ms and step > 1:  # the first step warms up
                bubbles.append(bubble(watched, world))
            if pipe.last and (step % 20 == 0 or step in (1, args.steps)):
                ranks.say(f"step {step}/{args.steps}: loss {loss.item():.4f}")
        alive = f"at most {watched.most_alive} of {m} micro-batches' activations alive"
        lines = [f"stage {rank}: {alive}"]
        if bubbles:
            theory, median = (world - 1) / (m + world - 1), statistics.median(bubbles)
            lines.append(f"stage {rank}: bubble {median:.3f} of the step (median of "
                         f"{len(bubbles)}), theory (p-1)/(m+p-1) = {theory:.3f}")  # fmt: skip
        ranks.say(*lines)  # one write: the stages print at the same moment
        dist.barrier()  # leave together
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    backend, world = ranks.backend_and_world_size(args.backend, args.nproc)
    if args.depth < world:
        raise SystemExit(f"pipeline.py: error: --depth {args.depth} is less than {world} stages")
    mp.spawn(worker, args=(world, backend, ranks.free_port(), args), nprocs=world)


if __name__ == "__main__":
    sys.exit(exit_with_one_line(main))
