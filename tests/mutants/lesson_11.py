"""Realistic wrong versions of lesson 11 (pipeline.py: the pipeline steps, GPipe, 1F1B and
PyTorch's schedules), and an honest different version.

Format: see lesson_03.py.
"""

FILE = "11_model_parallel/pipeline.py"
TENSOR = "11_model_parallel/tensor.py"  # part 2: tensor parallelism

MUTANTS = [
    dict(
        name="loss_not_divided",
        why="each micro-batch's mean loss back-propagated whole: the gradients are the sum "
        "over micro-batches, 4 times the whole batch's",
        old="        y = F.cross_entropy(y.flatten(0, 1), targets.flatten()) / micro_batches\n",
        new="        y = F.cross_entropy(y.flatten(0, 1), targets.flatten())\n",
        caught_by="computes_what_the_whole_model",
    ),
    dict(
        name="loss_end_confused",
        why="backward from the loss on the first stage instead of the last: the first "
        "stage's output is no loss but an activation, and its gradient comes from the next",
        old="    y.backward() if pipe.last else y.backward(pipe.recv_backward())\n",
        new="    y.backward() if pipe.first else y.backward(pipe.recv_backward())\n",
        caught_by="computes_what_the_whole_model",
    ),
    dict(
        name="one_micro_batch_at_a_time",
        why="each micro-batch forward and backward through every stage before the next: "
        "no two stages ever work at once",
        old="    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()\n",
        new="    warmup, saved = 0, deque()\n",
        caught_by="bubble_is_what_theory",
    ),
    dict(
        name="gpipe_called_1f1b",
        why="every forward first, then every backward: GPipe's memory under 1F1B's name",
        old="    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()\n",
        new="    warmup, saved = m, deque()\n",
        caught_by="1f1b_only_the_stages_after",
    ),
    dict(
        name="gpipe_interleaved",
        why="GPipe's backward run right after each forward: sequential micro-batches",
        old="""    saved = [forward_step(pipe, inputs[i], targets[i], len(inputs)) for i in range(len(inputs))]
    for x, y in saved:
        backward_step(pipe, x, y)
""",
        new="""    for i in range(len(inputs)):
        backward_step(pipe, *forward_step(pipe, inputs[i], targets[i], len(inputs)))
""",
        caught_by="gpipe_keeps_every_micro_batch",
    ),
    dict(
        name="torch_schedule_always_gpipe",
        why="ScheduleGPipe built whatever the name: --schedule torch-1f1b is GPipe",
        old='    schedule = ScheduleGPipe if name == "torch-gpipe" else Schedule1F1B\n',
        new="    schedule = ScheduleGPipe\n",
        caught_by="torch_pipelining_computes_the_same",
    ),
    dict(
        file=TENSOR,
        name="f_without_all_reduce",
        why="f's backward passes each rank's partial input gradient on: the norm and "
        "everything before the block learn from half the gradient",
        old="        grad = grad.clone()  # autograd may hand the same tensor to others: do not change it\n        dist.all_reduce(grad)\n        return grad\n",
        new="        return grad\n",
        caught_by="whole_block_computes",
    ),
    dict(
        file=TENSOR,
        name="g_reduces_in_backward_too",
        why="g all-reduces its gradient in backward as well: every gradient before it "
        "counted twice",
        old="        return total\n        ### END SOLUTION\n\n    @staticmethod\n"
        "    def backward(ctx, grad):\n        return grad\n",
        new="        return total\n        ### END SOLUTION\n\n    @staticmethod\n"
        "    def backward(ctx, grad):\n        grad = grad.clone()\n"
        "        dist.all_reduce(grad)\n        return grad\n",
        caught_by="one_all_reduce_in_forward",
    ),
    dict(
        file=TENSOR,
        name="up_split_by_input_features",
        why="up split along its input features, down along its output features: each rank "
        "holds a slice that does not match the other's",
        old="        self.up_weight = nn.Parameter(up.weight.detach().chunk(world, 0)[rank].clone())\n",
        new="        self.up_weight = nn.Parameter(up.weight.detach().chunk(world, 1)[rank].clone())\n",
        caught_by="whole_block_computes",
    ),
    dict(
        file=TENSOR,
        name="bias_before_the_sum",
        why="down's bias added on every rank before g: the sum counts it world times",
        old="        return SumOverRanks.apply(F.linear(h, self.down_weight)) + self.down_bias\n",
        new="        return SumOverRanks.apply(F.linear(h, self.down_weight, self.down_bias))\n",
        caught_by="whole_block_computes",
    ),
    dict(
        file=TENSOR,
        name="dtensor_both_columnwise",
        why="both layers split column-wise: down's input is expected whole, so DTensor "
        "gathers up's output and down's output stays split",
        old='    return parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})\n',
        new='    return parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": ColwiseParallel()})\n',
        caught_by="dtensor_split",
    ),
    dict(
        name="gpipe_on_torch_schedules",
        why="gpipe built on torch.distributed.pipelining's ScheduleGPipe, given the shapes up "
        "front: the library runs the schedule the exercise asks for by hand",
        old="""    saved = [forward_step(pipe, inputs[i], targets[i], len(inputs)) for i in range(len(inputs))]
    for x, y in saved:
        backward_step(pipe, x, y)
""",
        new="""    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    shape = (*pipe.shape[:-1], pipe.stage(inputs[0]).shape[-1]) if pipe.first else pipe.shape
    example = torch.zeros(shape) if not pipe.first else inputs[0]
    stage = PipelineStage(pipe.stage, pipe.rank, pipe.world, pipe.device,
                          input_args=(example,), output_args=torch.zeros(pipe.shape))
    schedule = ScheduleGPipe(stage, len(inputs), loss_fn=lambda y, t: F.cross_entropy(
        y.flatten(0, 1), t.flatten()))
    losses = []
    kwargs = dict(target=torch.cat(targets), losses=losses) if pipe.last else {}
    schedule.step(*([torch.cat(inputs)] if pipe.first else []), **kwargs)
    if pipe.last:
        pipe.losses.append(torch.stack(losses).mean())
""",
        caught_by="computes_what_the_whole_model",
        says=("from PyTorch's library",),
    ),
    dict(
        name="whole_model_on_every_rank",
        why="pipeline.py's own schedules run the whole model on every rank, each a pipeline "
        "of one stage: the same losses and activation counts, and no pipeline at all",
        old="        stage = build_stage(rank, world, args.dim, args.depth, args.seed)\n",
        new='        whole = not args.schedule.startswith("torch")  # every rank: all of it\n'
        "        stage = build_stage(0, 1 if whole else world, args.dim, args.depth, args.seed) "
        "if whole else build_stage(rank, world, args.dim, args.depth, args.seed)\n",
        also=[
            dict(
                old="        pipe = Pipe(watched, rank, world, (size, 16, args.dim), device)",
                new="        pipe = Pipe(watched, 0 if whole else rank, 1 if whole else world, "
                "(size, 16, args.dim), device)",
            )
        ],
        caught_by="own_schedule",
        says=("None at all",),
    ),
    # Not TODOs: a flag the grading runs away from its default, whose effect it must see.
    dict(
        name="pipeline_seed_ignored",
        why="pipeline.py's --seed not passed on: every stage built from seed 0's weights",
        old="    torch.manual_seed(seed)  #",
        new="    torch.manual_seed(0)  #",
        caught_by="pipeline_script",
    ),
    dict(
        name="tensor_seed_ignored",
        file=TENSOR,
        why="tensor.py's --seed not used: every run starts from seed 0's weights",
        old="torch.manual_seed(args.seed)",
        new="torch.manual_seed(0)",
        caught_by="tensor_parallel_script",
    ),
]

MUTANTS += [
    dict(
        file=TENSOR,
        name="slices_kept_as_views",
        why="the weight slices kept as views: each rank's storage is still the whole weight",
        old="        self.up_weight = nn.Parameter(up.weight.detach().chunk(world, 0)[rank].clone())\n",
        new="        self.up_weight = nn.Parameter(up.weight.detach().chunk(world, 0)[rank])\n",
        also=[
            dict(
                file=TENSOR,
                old="        self.down_weight = nn.Parameter(down.weight.detach().chunk(world, 1)[rank].clone())\n",
                new="        self.down_weight = nn.Parameter(down.weight.detach().chunk(world, 1)[rank])\n",
            )
        ],  # fmt: skip
        caught_by="split_mlp_computes",
        says=("a slice kept as a view",),
    ),
    dict(
        file=TENSOR,
        name="dtensor_gathers_the_hidden_activations",
        why="up's output gathered whole, then split again for down: an all-gather too many",
        old='{"up": ColwiseParallel(), "down": RowwiseParallel()}',
        new='{"up": ColwiseParallel(output_layouts=Replicate()),\n'
        '                                              "down": RowwiseParallel(input_layouts=Replicate())}',
        also=[
            dict(
                file=TENSOR,
                old="    ### BEGIN SOLUTION\n    return parallelize_module(",
                new="    from torch.distributed.tensor import Replicate\n\n"
                "    ### BEGIN SOLUTION\n    return parallelize_module(",
            )
        ],  # fmt: skip
        caught_by="dtensor_split",
        says=("up's output gathered whole",),
    ),
    dict(
        file=TENSOR,
        name="f_reduces_the_given_gradient_in_place",
        why="f's backward all-reduces the gradient autograd handed it, in place: a tensor "
        "autograd may have handed another input too",
        old="        grad = grad.clone()  # autograd may hand the same tensor to others: do not "
        "change it\n",
        new="",
        caught_by="one_all_reduce_in_forward_and_one_in_backward",
        says=("which autograd also handed to v",),
    ),
    dict(
        file=TENSOR,
        name="g_sums_its_input_in_place",
        why="g's forward all-reduces the tensor it is given, in place: its caller's tensor",
        old="        total = partial.clone()\n",
        new="        total = partial\n",
        caught_by="one_all_reduce_in_forward_and_one_in_backward",
        says=("SumOverRanks' forward changed the tensor it was given",),
    ),
    dict(
        file=FILE,
        name="bubble_theory_without_its_numerator",
        why="the printed theory 1/(m+p-1): right only at 2 stages, where p - 1 = 1",
        old="theory, median = (world - 1) / (m + world - 1),",
        new="theory, median = 1 / (m + world - 1),",
        caught_by="pipelines_over_more_stages",
        says=("the theory each stage printed beside its bubble",),
    ),
]

ALTERNATIVES = [
    dict(
        name="reversed_backwards_and_a_counted_1f1b",
        why="GPipe's backwards from the last micro-batch to the first (each stage in the "
        "same order, so the messages still match); 1F1B as one loop over the step's "
        "actions, counting forwards and backwards done; the stage's input asked for with "
        "torch.Tensor.requires_grad, and the loss averaged after the cross-entropy sum. "
        "Tensor parallelism: each rank every world-th hidden unit, not a contiguous slice; "
        "f's backward sums the ranks' gradients from an all-gather",
        old="""    saved = [forward_step(pipe, inputs[i], targets[i], len(inputs)) for i in range(len(inputs))]
    for x, y in saved:
        backward_step(pipe, x, y)
""",
        new="""    saved = []
    for tokens, target in zip(inputs, targets, strict=True):
        saved.append(forward_step(pipe, tokens, target, len(inputs)))
    while saved:
        backward_step(pipe, *saved.pop())
""",
        also=[
            dict(
                old="""    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()
    for i in range(warmup):
        saved.append(forward_step(pipe, inputs[i], targets[i], m))
    for i in range(warmup, m):
        saved.append(forward_step(pipe, inputs[i], targets[i], m))
        backward_step(pipe, *saved.popleft())
    while saved:
        backward_step(pipe, *saved.popleft())
""",
                new="""    ahead = pipe.world - pipe.rank  # micro-batches in flight on this stage, at most
    saved, done_f, done_b = [], 0, 0
    while done_b < m:
        if done_f < m and done_f - done_b < ahead:
            saved.append(forward_step(pipe, inputs[done_f], targets[done_f], m))
            done_f += 1
        else:
            backward_step(pipe, *saved.pop(0))
            done_b += 1
""",
            ),
            dict(
                old="""    x = tokens if pipe.first else pipe.recv_forward().requires_grad_()
    y = pipe.stage(x)
    if pipe.last:
        y = F.cross_entropy(y.flatten(0, 1), targets.flatten()) / micro_batches
""",
                new="""    if pipe.first:
        x = tokens
    else:
        x = pipe.recv_forward()
        x.requires_grad = True
    y = pipe.stage(x)
    if pipe.last:
        total = F.cross_entropy(y.flatten(0, 1), targets.flatten(), reduction="sum")
        y = total / (targets.numel() * micro_batches)
""",
            ),
            dict(
                file=TENSOR,
                old="""        up, down = block.up, block.down
        self.up_weight = nn.Parameter(up.weight.detach().chunk(world, 0)[rank].clone())
        self.up_bias = nn.Parameter(up.bias.detach().chunk(world, 0)[rank].clone())
        self.down_weight = nn.Parameter(down.weight.detach().chunk(world, 1)[rank].clone())
        self.down_bias = nn.Parameter(down.bias.detach().clone())
""",
                new="""        mine = torch.arange(rank, block.up.out_features, world)  # every world-th unit
        self.up_weight = nn.Parameter(block.up.weight.detach()[mine].clone())
        self.up_bias = nn.Parameter(block.up.bias.detach()[mine].clone())
        self.down_weight = nn.Parameter(block.down.weight.detach()[:, mine].clone())
        self.down_bias = nn.Parameter(block.down.bias.detach().clone())
""",
            ),
            dict(
                file=TENSOR,
                old="""        grad = grad.clone()  # autograd may hand the same tensor to others: do not change it
        dist.all_reduce(grad)
        return grad
""",
                new="""        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad.contiguous())
        return torch.stack(parts).sum(0)
""",
            ),
        ],
    ),
]
