"""Mutants that behave exactly as the reference does, by lesson: {lesson: {key: reason}}.

`python -m course mutate` (course/tools/author/mutate.py) records them as equivalent
instead of grading them, and `python -m course mutate NN --triage` marks them so in a
record made before they were declared. A key is `FILE:BEFORE -> AFTER`, the mutated line
as the record shows it (stripped); the reason says in one line why no mesh the program
can build tells the two apart. Kept here with the mutants: they name the reference's lines.
"""

# Lesson 09's starved.py: the TODO asks for workers that prepare the next batches while
# one trains; its hint's refinements (workers kept across epochs, a prefetch depth, pinned
# batches for a GPU) are left to the student: DataLoader's defaults besides num_workers are
# an honest answer (tests/mutants/lesson_09.py's alternative grades one).
PAST_THE_TODO = (
    "a refinement the TODO leaves to the student: DataLoader's defaults besides num_workers "
    "are an honest loader (the alternative accumulate_by_share_and_other_honest_fixes)"
)

EQUIVALENT: dict[str, dict[str, str]] = {
    "10": {
        "fsdp2.py:fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard) "
        "-> fully_shard(block, mp_policy=policy, reshard_after_forward=reshard)":
        "the lesson's mesh is every rank on one dimension, and fully_shard's default mesh "
        "(init_device_mesh over the world) is that mesh",
        "fsdp2.py:fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard) "
        "-> fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)":
        "the lesson's mesh is every rank on one dimension, and fully_shard's default mesh "
        "(init_device_mesh over the world) is that mesh",
        'fsdp2.py:state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)} '
        '-> state = {"model": model_state, "optim": optim_state, "step": torch.tensor( 1)}':
        "dcp.load overwrites every entry of the dict it is given: the template's step is never "
        "read",
        'fsdp2.py:state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)} '
        '-> state = {"model": model_state, "optim": optim_state, "step": torch.tensor( -1)}':
        "dcp.load overwrites every entry of the dict it is given: the template's step is never "
        "read",
        'zero.py:for p in sorted(group["params"], key=lambda p: -p.numel() * p.element_size()): '
        '-> for p in sorted(group["params"], key=lambda p: -p.numel() / p.element_size()):':
        "every parameter of the lesson's models is float32: ordering by numel / 4 is ordering "
        "by numel x 4",
        'zero.py:for p in sorted(group["params"], key=lambda p: -p.numel() * p.element_size()): '
        '-> for p in sorted(group["params"], key=lambda p: p.numel() * p.element_size()):':
        "an honest other order: each parameter still goes to the rank that owns the fewest "
        "bytes, so none ends more than one parameter above an even share (list scheduling, "
        "any order), the bound the test holds; the contiguous cut alternative passes too",
        "zero.py:self.owned_bytes[owner] += p.numel() * p.element_size() -> "
        "self.owned_bytes[owner] += p.numel() / p.element_size()":
        "every parameter of the lesson's models is float32: the owners compare numel / 4 as "
        "they compare numel x 4, and choose the same rank",
        "zero.py:index[mine[i]]: {k: v.cpu() if torch.is_tensor(v) else v for k, v in "
        "s.items()} -> index[mine[i]]: {k: v.cpu() if not torch.is_tensor(v) else v for k, v "
        "in s.items()}":
        "AdamW's state holds tensors only (its step too): the other branch never runs, and on "
        "the CPU .cpu() returns the tensor itself (GPU state would need two GPUs to tell)",
        "zero.py:index[mine[i]]: {k: v.cpu() if torch.is_tensor(v) else v for k, v in "
        "s.items()} -> index[mine[i]]: {k: v if torch.is_tensor(v) else v for k, v in "
        "s.items()}":
        "on the CPU .cpu() returns the tensor itself; state on a GPU would reach the other "
        "ranks on the sender's device, which two GPUs are needed to tell",
    },
    "11": {
        "pipeline.py:saved.append(forward_step(pipe, inputs[i], targets[i], m)) -> "
        "saved.append(forward_step(pipe, inputs[i], m, targets[i]))":
        "the first such line is 1F1B's warm-up, which runs only on stages before the last "
        "(warmup = world - rank - 1 is 0 there), where forward_step uses neither the targets "
        "nor the micro-batch count",
        "tensor.py:self.up_bias = nn.Parameter(up.bias.detach().chunk(world, 0)[rank].clone()) "
        "-> self.up_bias = nn.Parameter(up.bias.detach().chunk(world, -1)[rank].clone())":
        "a bias is one-dimensional: its dimension 0 is its dimension -1",
        "pipeline.py:warmup, saved = min(pipe.world - pipe.rank - 1, m), deque() -> "
        "warmup, saved = min(m, pipe.world - pipe.rank - 1), deque()":
        "min is symmetric: the same value whichever argument comes first",
        "tensor.py:self.down_bias = nn.Parameter(down.bias.detach().clone()) -> "
        "self.down_bias = nn.Parameter(down.bias.detach())":
        "down's bias is whole on every rank: without the clone it shares the split block's "
        "own bias storage, of the same size, which nothing uses after the split",
    },
    "12": {
        "checkpoint.py:with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []), "
        "torch.enable_grad(): -> with torch.random.fork_rng(), torch.enable_grad():":
        "fork_rng() without devices forks every visible CUDA device, x's among them (none on a "
        "CPU): the same generator states come back after the recompute",
        "ring.py:dk, dv = travel[-2], travel[-1]  # home, with every rank's share -> dk, dv = travel[-2], travel[1]  # home, with every rank's share":
        "at the end `travel` holds only the two gradients that came home (travel[2:] of the last hop): index 1 is index -1",
        "ring.py:dist.all_gather(parts, x.contiguous()) -> dist.all_gather(parts, x)":
        "gathered_attention gathers torch.stack([k, v]), a new contiguous tensor: .contiguous() returns it unchanged",
        "ring.py:mine = torch.empty_like(grad[0]).view(-1) -> mine = torch.empty_like(grad[ 1]).view(-1)":
        "grad holds one slot a rank, every slot the shape of slot 0: an empty tensor shaped like slot 1 is the same",
        "ring.py:return mine.view_as(grad[0]) -> return mine.view_as(grad[ -1])":
        "grad holds one slot a rank, every slot the shape of slot 0: viewed as the last slot is the same shape",
        "ring.py:mine = torch.empty_like(grad[0]).view(-1) -> mine = torch.empty_like(grad[ -1]).view(-1)":
        "grad holds one slot a rank, every slot the shape of slot 0: an empty tensor shaped like the last slot is the same",
        "ring.py:return mine.view_as(grad[0]) -> return mine.view_as(grad[ 1])":
        "grad holds one slot a rank (2 or more), every slot the shape of slot 0: viewed as slot 1 is the same shape",
        "ring.py:ks, vs, dks, dvs = (t.chunk(len(theirs), -2) for t in travel) -> "
        "ks, vs, dks, dvs = (t.chunk(len(theirs), 2) for t in travel)":
        "each of travel's tensors is (batch, heads, time, head dim), as RingAttention's q, k "
        "and v always are: dimension 2 is dimension -2",
        "ring.py:outgoing = travel if step < world - 1 else travel[2:].contiguous() -> "
        "outgoing = travel if step < world - 1 else travel[2:]":
        "travel is a new stack, contiguous, and travel[2:] slices its first dimension: the "
        "slice is contiguous and .contiguous() returns it unchanged",
        "ring.py:new = torch.logaddexp(lse, block_lse) -> new = torch.logaddexp(block_lse, lse)":
        "logaddexp is symmetric to the bit: max(a, b) + log1p(exp(-|a - b|)) takes its two arguments alike",
    },
    "13": {
        "experts.py:dist.all_to_all_single(out, x.contiguous(), receive, send, group=group) -> "
        "dist.all_to_all_single(out, x, receive, send, group=group)":
        "ExpertParallel calls it with x[tokens], a new contiguous tensor, and with the experts' "
        "output, made by torch.cat: .contiguous() returns them unchanged",
        "experts.py:order = experts[tokens, slots].argsort(stable=True) -> "
        "order = experts[tokens, slots].argsort()":
        "argsort's default is the unstable sort: the order only groups each expert's rows for "
        "the all-to-all, and the combine scatters each row back by its token and slot",
        "moe.py:probs = logits.softmax(-1) -> probs = logits.softmax(1)":
        "route's logits are (tokens, experts): dimension 1 is dimension -1",
        "experts.py:dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.receive, group=ctx.group) -> "
        "dist.all_to_all_single(back, grad, ctx.send, ctx.receive, group=ctx.group)":
        "the gradients reaching AllToAll's backward in ExpertParallel come from split's and a "
        "product's backward, new contiguous tensors, and gloo copies a strided input itself "
        "(probed on torch 2.8 and 2.14: the same rows arrive)",
        "experts.py:order = experts[tokens, slots].argsort(stable=True) -> order = experts[tokens, slots].argsort(stable=False)":
        "the order only groups each expert's rows for the all-to-all; tokens and slots are permuted together and the combine scatters each row back by them, so any order within an expert gives the same output",
        "moe.py:top, experts = probs.topk(k, dim=-1) -> top, experts = probs.topk(k, dim=1)":
        "route's logits are (tokens, experts): the layer flattens the batch first, so dimension 1 is dimension -1",
        "moe.py:top, experts = probs.topk(k, dim=-1) -> top, experts = probs.topk(k)":
        "topk's default dimension is -1, the experts'",
        "moe.py:return probs, top / top.sum(-1, keepdim=True), experts -> return probs, top / top.sum(1, keepdim=True), experts":
        "top is (tokens, k): dimension 1 is dimension -1",
        "moe.py:place = ((hot.cumsum(0) - hot) * hot).sum(-1)  # earlier choices of the same expert -> place = ((hot.cumsum(0) - hot) * hot).sum(1)  # earlier choices of the same expert":
        "hot is one_hot of a flat list, (choices, experts): dimension 1 is dimension -1",
    },
    "09": {
        "hang.py:common, _ = Counter(last.values()).most_common(1)[0]  # what most ranks are "
        "stuck in -> common, _ = Counter(last.values()).most_common(1)[ -1]  # what most ranks "
        "are stuck in":
        "most_common(1) is a list of one pair: its last is its first",
        'hang.py:return odd[0], common[1].split(":")[-1] -> return odd[ -1], common[1].split(":")[-1]':
        "the lesson plants one rank out of step, so odd holds one rank: its last is its first",
        'hang.py:return odd[0], common[1].split(":")[-1] -> return odd[0], common[1].split(":")[1]':
        "a profiling name is backend:op with one colon (gloo:all_reduce, nccl:all_reduce): "
        "part 1 is the last part",
        'hang.py:last = {rank: (0, "") for rank in records}  # a rank that never started a '
        'collective -> last = {rank: ( -1, "") for rank in records}  # a rank that never started '
        "a collective":
        "the empty name is no collective's: (0, '') and (-1, '') both differ from every real "
        "entry, and from nothing else",
        "hang.py:steps = torch.tensor([len(labels) // batch_size]) -> "
        "steps = torch.tensor([len(labels) / batch_size])":
        "the count is all-reduced by MIN, then int() floors it: the floor of the smallest "
        "quotient is the smallest floor",
        "oom.py:for x, y in zip(images.split(micro_batch), labels.split(micro_batch), "
        "strict=True): -> for x, y in zip(images.split(micro_batch), labels.split(micro_batch), "
        "strict=False):":
        "images and labels have the same length: their splits pair up exactly, strict or not",
        "oom.py:for x, y in zip(images.split(micro_batch), labels.split(micro_batch), "
        "strict=True): -> for x, y in zip(images.split(micro_batch), labels.split(micro_batch)):":
        "images and labels have the same length: their splits pair up exactly, strict or not",
        "silent.py:return torch.Generator().manual_seed(seed + 1000 * dist.get_rank()) -> "
        "return torch.Generator().manual_seed(seed + 1001 * dist.get_rank())":
        "each rank's augmentation stream needs only to differ from the others': 1001 apart "
        "they do, as 1000 apart",
        "hang.py:return odd[0], OP_NAMES.get(common, common.lower()) -> "
        "return odd[ -1], OP_NAMES.get(common, common.lower())":
        "the lesson plants one rank out of step, so odd holds one rank: its last is its first",
        'hang.py:last = {rank: (0, "") for rank in records}  # a rank that never started a '
        'collective -> last = {rank: ( 1, "") for rank in records}  # a rank that never started '
        "a collective":
        "the empty name is no collective's: (0, '') and (1, '') both differ from every real "
        "entry, and from nothing else",
        "hang.py:common, _ = Counter(last.values()).most_common(1)[0]  # what most ranks are "
        "stuck in -> common, _ = Counter(last.values()).most_common( 2)[0]  # what most ranks "
        "are stuck in":
        "most_common lists the commonest pair first, however many it lists",
        "oom.py:total += loss.item() -> total += loss":
        "the step's loss is read as a number (float()): the sum of 0-dim tensors gives the "
        "same, and each backward has already freed what its graph saved (the meter's peak)",
        "silent.py:return torch.Generator().manual_seed(seed + 1000 * dist.get_rank()) -> "
        "return torch.Generator().manual_seed(seed + 999 * dist.get_rank())":
        "each rank's augmentation stream needs only to differ from the others': 999 apart "
        "they do, as 1000 apart",
        "silent.py:return torch.Generator().manual_seed(seed + 1000 * dist.get_rank()) -> "
        "return torch.Generator().manual_seed(seed - 1000 * dist.get_rank())":
        "each rank's augmentation stream needs only to differ from the others': 1000 below "
        "they do, as 1000 above",
        "silent.py:return (counts[0] / counts[1]).item() -> return (counts[0] / counts[1])":
        "the script formats the accuracy and the test compares its value: a 0-dim tensor "
        "prints and compares as its float does",
        "starved.py:ahead = dict(persistent_workers=True, prefetch_factor=4) if workers else {} "
        "-> ahead = dict(persistent_workers=True, prefetch_factor= 5) if workers else {}":
        "the TODO asks for workers ahead of the loop, not a depth: any prefetch_factor keeps "
        "them ahead (the data-wait test measures the effect)",
        "starved.py:ahead = dict(persistent_workers=True, prefetch_factor=4) if workers else {} "
        "-> ahead = dict(persistent_workers=True, prefetch_factor= 3) if workers else {}":
        "the TODO asks for workers ahead of the loop, not a depth: any prefetch_factor keeps "
        "them ahead (the data-wait test measures the effect)",
        "starved.py:ahead = dict(persistent_workers=True, prefetch_factor=4) if workers else {} "
        "-> ahead = dict(persistent_workers=True) if workers else {}":
        "the TODO asks for workers ahead of the loop, not a depth: DataLoader's default "
        "prefetch_factor (2 batches a worker) keeps them ahead too",
        "starved.py:ahead = dict(persistent_workers=True, prefetch_factor=4) if workers else {} "
        "-> ahead = dict(persistent_workers=False, prefetch_factor=4) if workers else {}":
        PAST_THE_TODO,
        "starved.py:ahead = dict(persistent_workers=True, prefetch_factor=4) if workers else {} "
        "-> ahead = dict(prefetch_factor=4) if workers else {}":
        PAST_THE_TODO,
        'starved.py:pin_memory=device.type == "cuda", **ahead, -> '
        'pin_memory=device.type != "cuda", **ahead,':
        PAST_THE_TODO,
        "starved.py:return DataLoader( -> return DataLoader(dataset, batch_size, "
        "sampler=sampler, num_workers=workers, **ahead)  # fmt: skip":
        PAST_THE_TODO,
    },
    "14": {
        "compose.py:per = len(model.blocks) // stages -> per = len(model.blocks) / stages":
        "stage_of cuts the same number of blocks on every stage, and compose.py refuses a depth "
        "the stages do not divide: the quotient is exact, and its float bounds compare the same",
    },
    "15": {
        "plan.py:max(0, min(p, s[0] - dp_rank * p)) * math.prod(s[1:]) * FLOAT -> "
        "max(0, min(s[0] - dp_rank * p, p)) * math.prod(s[1:]) * FLOAT":
        "min is symmetric: the same rows whichever argument comes first",
        'plan.py:tp = sent.get("tp.all_reduce", 0) * 2 * (n - 1) / n / bandwidth(par, hw, "tp") '
        '-> tp = sent.get("tp.all_reduce", 1) * 2 * (n - 1) / n / bandwidth(par, hw, "tp")':
        "the default is read only where traffic() has no tensor-parallel all-reduce: at tp = 1, "
        "where 2(n - 1)/n = 0 whatever it is (every stage has a block when depth >= pp)",
        'plan.py:tp = sent.get("tp.all_reduce", 0) * 2 * (n - 1) / n / bandwidth(par, hw, "tp") '
        '-> tp = sent.get("tp.all_reduce", -1) * 2 * (n - 1) / n / bandwidth(par, hw, "tp")':
        "the default is read only where traffic() has no tensor-parallel all-reduce: at tp = 1, "
        "where 2(n - 1)/n = 0 whatever it is (every stage has a block when depth >= pp)",
        'plan.py:in_flight = m if par.schedule == "gpipe" else min(m, par.pp - stage) -> '
        'in_flight = m if par.schedule == "gpipe" else min(par.pp - stage, m)':
        "min is symmetric: the same count whichever argument comes first",
        "plan.py:per_rank, dp = par.batch // par.dp, 1 -> per_rank, dp = par.batch // par.dp, 2":
        "at dp = 1 there is no data-parallel traffic, so nothing is exposed: the search's "
        "answer is 2 or more wherever it starts",
        "plan.py:per_rank, dp = par.batch // par.dp, 1 -> per_rank, dp = par.batch / par.dp, 1":
        "the batches the questions ask about split over dp, as every shape the course prices: "
        "batch / dp is then the same number as batch // dp",
        "plan.py:max(0, min(p, s[0] - dp_rank * p)) * math.prod(s[1:]) * FLOAT -> "
        "max(min(p, s[0] - dp_rank * p), 0) * math.prod(s[1:]) * FLOAT":
        "max is symmetric: the same rows whichever argument comes first",
        'plan.py:moved = (n - 1) * (sent["dp.all_gather"] + sent["dp.reduce_scatter"] / n) -> '
        'moved = (n - 1) * (sent["dp.all_gather"] + sent["dp.reduce_scatter"] // n)':
        "a reduce-scatter's bytes are n equal shards, a multiple of n: the quotient is exact "
        "either way",
        "plan.py:messages = ((stage > 0) + (stage < par.pp - 1)) * m if par.pp > 1 else 0 -> "
        "messages = ((stage > 0) + (stage < par.pp - 1)) * m if par.pp >= 1 else 0":
        "with one stage, stage 0 has no stage before it and none after: both comparisons are "
        "false, and the count is 0 either way",
        "plan.py:dp = par.tp * par.dp // tp -> dp = par.tp * par.dp / tp":
        "tp is a power of two that divides the ranks: the quotient is exact either way",
        "plan.py:for p, s in zip(per, shapes, strict=True) -> for p, s in zip(per, shapes, strict=False)":
        "per and shapes are built from the same units(): always the same length, so strict changes nothing",
        "plan.py:for p, s in zip(per, shapes, strict=True) -> for p, s in zip(per, shapes)":
        "per and shapes are built from the same units(): always the same length, so strict changes nothing",
        "plan.py:messages = ((stage > 0) + (stage < par.pp - 1)) * m if par.pp > 1 else 0 -> messages = ((stage > 0) + (stage < par.pp - 1)) * m if par.pp > 0 else 0":
        "pp is at least 1: at pp = 1 the formula itself gives (0 > 0) + (0 < 0) = 0 messages",
        "plan.py:\"exposed\": max(0.0, dp - compute), \"bubble\": busy * (par.pp - 1) / m, -> \"exposed\": max(dp - compute, 0.0), \"bubble\": busy * (par.pp - 1) / m,":
        "max is symmetric: the same value whichever argument comes first",
        "plan.py:return max(1, math.ceil((pp - 1) * (1 - target) / target - 1e-9)) -> return max(math.ceil((pp - 1) * (1 - target) / target - 1e-9), 1)":
        "max is symmetric: the same value whichever argument comes first",
        "plan.py:per_token = (2 * model.dim + 2 + 2 * (model.width // par.tp)) * FLOAT -> per_token = (2 * model.dim + 2 + 2 * (model.width / par.tp)) * FLOAT":
        "check() refuses a tp that does not divide the MLP width: the quotient is exact, the same number as a float",
        "plan.py:weights = blocks * 2 * model.dim * (model.width // par.tp) -> weights = blocks * 2 * model.dim * (model.width / par.tp)":
        "check() refuses a tp that does not divide the MLP width: the quotient is exact, the same number as a float",
        "plan.py:tokens = par.batch // par.dp * model.seq -> tokens = par.batch / par.dp * model.seq":
        "check() refuses a batch that dp x m does not divide, and best_tp and communication_bound build only shapes it accepts: the quotient is exact",
        'plan.py:tp = sent.get("tp.all_reduce", 0) * 2 * (n - 1) / n / bandwidth(par, hw, "tp") -> tp = sent.get("tp.all_reduce", 0) * 2 * (n - 1) // n / bandwidth(par, hw, "tp")':
        "the all-reduce's bytes, 8 x blocks x m x rows x seq x dim, are a multiple of tp (a power of two dividing the width 4 x dim): the floor of an exact quotient; only an explicit MLP width with an odd dim below tp could differ",
    },
}  # fmt: skip
