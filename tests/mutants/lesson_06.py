"""Realistic wrong versions of lesson 06 (MiniDDP), and honest different ones.

Each entry rewrites the reference solution: `old` must appear exactly once in
solutions/06_ddp_from_scratch/mini_ddp.py and becomes `new`. A mutant must be rejected
by the tests whose names contain `caught_by`; an alternative must pass every test of
the lesson. tests/mutants/test_mutants.py applies them.
"""

FILE = "06_ddp_from_scratch/mini_ddp.py"

MUTANTS = [
    dict(
        name="no_broadcast",
        why="the constructor copies nothing: every rank keeps its own random start",
        old="                dist.broadcast(tensor, src=0)\n",
        new="                pass\n",
        caught_by="rank_0s_weights",
    ),
    dict(
        name="parameters_only",
        why="the broadcast skips the buffers (running statistics, fixed offsets)",
        old="            for tensor in [*module.parameters(), *module.buffers()]:\n",
        new="            for tensor in module.parameters():\n",
        caught_by="rank_0s_weights",
        says=("the broadcast skips module.buffers()",),
    ),
    dict(
        name="summed_not_averaged",
        why="the gradients are summed over the ranks and never divided by the world size",
        old="            flat = torch.cat([p.grad.reshape(-1) for p in bucket]) / self.world\n",
        new="            flat = torch.cat([p.grad.reshape(-1) for p in bucket])\n",
        caught_by="equals_one_process",
    ),
    dict(
        name="offset_never_advances",
        why="every parameter of a bucket gets the bucket's first values back",
        old="                offset += param.numel()\n",
        new="",
        caught_by="equals_one_process",
    ),
    dict(
        name="state_not_reset",
        why="finish does not reset the bucket counters: from step 2 nothing is sent",
        old="        self._arrived = [0] * len(self.buckets)\n        self._next = 0\n",
        new="",
        caught_by="equals_one_process",
    ),
    dict(
        name="buckets_in_forward_order",
        why="buckets follow the parameters' registration order: the first bucket holds the "
        "first layer, whose gradient comes last, so nothing is sent until backward ends",
        old="        for param in reversed(trainable):\n",
        new="        for param in trainable:\n",
        caught_by="during_backward",
    ),
    dict(
        name="waits_in_the_hook",
        why="the hook starts the all-reduce and waits for it at once: backward stalls on "
        "every bucket, nothing overlaps",
        old="            work = dist.all_reduce(flat, async_op=True)\n",
        new="            work = dist.all_reduce(flat, async_op=True)\n            work.wait()\n",
        caught_by="during_backward",
    ),
    dict(
        name="shared_weight_hooked_twice",
        why="parameters(remove_duplicate=False): a tied weight is listed, hooked and sent twice",
        old="        trainable = [p for p in module.parameters() if p.requires_grad]\n",
        new="        trainable = [p for p in module.parameters(remove_duplicate=False) "
        "if p.requires_grad]\n",
        caught_by="fewer_all_reduces",
    ),
    dict(
        name="frozen_parameters_hooked",
        why="every parameter gets a hook, frozen ones too (PyTorch refuses: no gradient)",
        old="        trainable = [p for p in module.parameters() if p.requires_grad]\n",
        new="        trainable = list(module.parameters())\n",
        caught_by="equals_one_process",
    ),
    # Not a TODO: a flag the grading runs away from its default.
    dict(
        name="wrapper_ignored",
        why="--wrapper read but not used: MiniDDP trains either way",
        old='    if args.wrapper == "torch":',
        new="    if False:",
        caught_by="trains_as_torch_ddp",
    ),
]

ALTERNATIVES = [
    dict(
        # Two honest rewrites of different TODOs in one submission: one grading of the whole
        # lesson passes both (every test runs on each of them).
        name="own_bucketing_and_sending",
        why="a new bucket starts when the next parameter would overflow the cap; and no "
        "in-order queue: a bucket is sent the moment its last gradient arrives (the same "
        "order on every rank, since backward runs the same graph)",
        old="""        size = 0.0
        for param in reversed(trainable):
            if not self.buckets or cap is None or size >= cap:
                self.buckets.append([])
                size = 0.0
            self.buckets[-1].append(param)
            size += param.numel() * param.element_size()
""",
        new="""        size = 0.0
        for param in reversed(trainable):
            nbytes = param.numel() * param.element_size()
            if not self.buckets or cap is None or (size + nbytes > cap and size > 0):
                self.buckets.append([])
                size = 0.0
            self.buckets[-1].append(param)
            size += nbytes
""",
        also=[
            dict(
                old="""        self._arrived[index] += 1
        while self._next < len(self.buckets) and self._arrived[self._next] == len(
            self.buckets[self._next]
        ):
            bucket = self.buckets[self._next]
            self._next += 1
""",
                new="""        self._arrived[index] += 1
        if self._arrived[index] == len(self.buckets[index]):
            bucket = self.buckets[index]
            self._next += 1
""",
            )
        ],
    ),
]
