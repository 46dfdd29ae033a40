"""Realistic wrong versions of lesson 10 (ShardedOptimizer, ZeRO stage 1, in zero.py;
MiniFSDP, ZeRO stage 3, in fsdp.py; FSDP2 and distributed checkpoints in fsdp2.py), and an
honest different version of all three.

Format: see lesson_03.py.
"""

FILE = "10_sharding/zero.py"
FSDP = "10_sharding/fsdp.py"  # part 2: MiniFSDP
FSDP2 = "10_sharding/fsdp2.py"  # part 3: PyTorch's FSDP2 and distributed checkpoints

MUTANTS = [
    dict(
        name="dealt_by_count",
        why="parameters dealt out in turn, whatever their size: one rank gets the big weights",
        old="key=lambda p: -p.numel() * p.element_size()):",
        new="key=lambda p: 0):",  # a stable sort: the group's own order
        also=[
            dict(
                old="    owner = min(range(self.world), key=self.owned_bytes.__getitem__)\n",
                new="    owner = len(self.owner) % self.world\n",
            )
        ],
        caught_by="half_of_adamws_state",
    ),
    dict(
        name="every_rank_steps_everything",
        why="the inner optimizer built over the whole group: no memory saved",
        old='    mine = {**group, "params": [p for p in group["params"] if self.owner[p] == self.rank]}',
        new='    mine = {**group, "params": list(group["params"])}',
        caught_by="half_of_adamws_state",
    ),
    dict(
        name="whole_step_then_drop",
        why="every rank steps the whole model, then drops the state of what it does not own: "
        "a shard at rest, the whole state during step()",
        old='    mine = {**group, "params": [p for p in group["params"] if self.owner[p] == self.rank]}',
        new='    mine = {**group, "params": list(group["params"])}',
        also=[
            dict(
                old="        loss = self.local.step(closure)\n",
                new="        loss = self.local.step(closure)\n"
                "        for p in [p for p in self.local.state if self.owner[p] != self.rank]:\n"
                "            del self.local.state[p]  # not mine: forget it\n",
            )
        ],
        caught_by="half_of_adamws_state",
        says=("during step()", "dropped after the step"),
    ),
    dict(
        name="zero_redundancy_optimizer_inside",
        why="ShardedOptimizer built on PyTorch's ZeroRedundancyOptimizer: the library does "
        "the sharding the exercise asks for",
        old="""        if self.local is None:
            self.local = self._make_local([mine])
""",
        new="""        if self.local is None:
            hyper = {k: v for k, v in group.items() if k != "params"}
            self.local = ZeroRedundancyOptimizer([mine], torch.optim.AdamW, **hyper)
""",
        also=[
            dict(
                old='    mine = {**group, "params": [p for p in group["params"] if self.owner[p] == self.rank]}',
                new='    mine = {**group, "params": list(group["params"])}',
            ),
            dict(
                old="""        works = [
            dist.broadcast(p, src=self.owner[p], async_op=True)""",
                new="""        works = [  # ZeroRedundancyOptimizer.step() has sent them already
            dist.barrier(async_op=True)""",
            ),
        ],
        caught_by="trains_like_adamw",
        says=("used ZeroRedundancyOptimizer",),
    ),
    dict(
        name="no_broadcast",
        why="each rank steps its shard and keeps it: the other ranks never see the update",
        old="            dist.broadcast(p, src=self.owner[p], async_op=True)\n",
        new="            dist.barrier(async_op=True)\n",
        caught_by="trains_like_adamw",
    ),
    dict(
        name="broadcast_from_rank_0",
        why="every parameter sent from rank 0, which stepped only its own shard",
        old="            dist.broadcast(p, src=self.owner[p], async_op=True)\n",
        new="            dist.broadcast(p, src=0, async_op=True)\n",
        caught_by="trains_like_adamw",
    ),
    dict(
        name="schedule_never_reaches_the_step",
        why="an lr changed in param_groups (a scheduler) is not passed to the inner optimizer",
        old='            mine.update({k: v for k, v in group.items() if k != "params"})\n',
        new="            pass\n",
        caught_by="trains_like_adamw",
    ),
    dict(
        name="state_dict_of_this_rank_only",
        why="state_dict() returns this rank's shard, numbered by the inner optimizer",
        old="        dist.all_gather_object(shards, shard)\n",
        new='        shards = [dict(local["state"])]\n',
        caught_by="unsharded_optimizers",
    ),
    dict(
        file=FSDP,
        name="all_reduce_then_slice",
        why="the whole gradient all-reduced, then this rank's slice kept: every rank "
        "receives every gradient, the traffic and memory ZeRO-3 saves",
        old="        dist.reduce_scatter_tensor(mine, flat)\n",
        new="        dist.all_reduce(flat)\n        mine = flat.chunk(ctx.world)[dist.get_rank()]\n",
        caught_by="reduce_scatters",
    ),
    dict(
        file=FSDP,
        name="gradients_summed",
        why="the reduce-scattered gradient not divided by the world size: twice the step",
        old="        return mine / ctx.world, None, None\n",
        new="        return mine, None, None\n",
        caught_by="trains_like_one_process",
    ),
    dict(
        file=FSDP,
        name="blocking_gather",
        why="the all-gather waited for where it starts: the prefetch overlaps nothing",
        old="        work = dist.all_gather_into_tensor(buffer, send, async_op=True)\n",
        new="        dist.all_gather_into_tensor(buffer, send)\n"
        "        work = dist.barrier(async_op=True)\n",
        caught_by="travels_while",
    ),
    dict(
        file=FSDP,
        name="cast_after_the_gather",
        why="the fp32 shard sent, the gathered weight cast after: twice the bytes on the wire",
        old="        send = shard.to(self.compute_dtype) if self.compute_dtype else shard  # cast first\n",
        new="        send = shard\n",
        caught_by="communicate_and_compute",
    ),
    dict(
        file=FSDP,
        name="no_prefetch",
        why="each layer gathers its own weight in its pre-hook, nothing ahead",
        old="            self.pending[nxt] = self._start_gather(nxt)\n",
        new="            pass\n",
        caught_by="travels_while",
    ),
    dict(
        file=FSDP,
        name="saved_view_rebuilt_wrong",
        why="backward's weight rebuilt with view(size): the transposed view autograd saved "
        "for a Linear comes back with the wrong layout",
        old="        return buffer.as_strided(size, stride, offset)\n",
        new="        return buffer[: size.numel()].view(size)\n",
        caught_by="trains_like_one_process",
    ),
    dict(
        file=FSDP,
        name="full_weight_kept_for_backward",
        why="no saved-tensor hook: autograd keeps every full weight from forward to backward",
        old="        if saved.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():\n",
        new="        if False:\n",
        caught_by="gathers_again",
    ),
    dict(
        file=FSDP2,
        name="fsdp2_root_only",
        why="fully_shard on the root only: one unit, every weight gathered for the whole forward",
        old="""    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
""",
        new="",
        caught_by="fsdp2_shards_every_block",
    ),
    dict(
        file=FSDP2,
        name="fsdp2_blocks_only",
        why="the blocks sharded, the root not: the embedding and the norm stay whole",
        old="    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)\n",
        new="",
        caught_by="fsdp2_shards_every_block",
    ),
    dict(
        file=FSDP2,
        name="fsdp2_policy_ignores_the_dtype",
        why="MixedPrecisionPolicy without param_dtype: bf16 asked, fp32 gathered and computed",
        old="MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)",
        new="MixedPrecisionPolicy(reduce_dtype=torch.float32)",
        caught_by="gathers_and_computes_in_bf16",
    ),
    dict(
        file=FSDP2,
        name="fsdp2_reduces_in_bf16",
        why="no reduce_dtype: gradients travel and are summed in bf16",
        old="MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)",
        new="MixedPrecisionPolicy(param_dtype=compute_dtype)",
        caught_by="gathers_and_computes_in_bf16",
    ),
    dict(
        file=FSDP2,
        name="fsdp2_reshard_flag_ignored",
        why="reshard_after_forward not passed on: FSDP2's default (True) whatever was asked",
        old="""        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
""",
        new="""        fully_shard(block, mesh=mesh, mp_policy=policy)
""",
        caught_by="reshards_after_forward_only",
    ),
    dict(
        file=FSDP2,
        name="root_keeps_its_parameters_whole",
        why="the root's fully_shard without reshard_after_forward: FSDP2 then keeps the root's "
        "own parameters whole after forward, whatever was asked",
        old="""    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
""",
        new="""    fully_shard(model, mesh=mesh, mp_policy=policy)
""",
        caught_by="reshards_after_forward_only",
        says=["the root's fully_shard"],
    ),
    dict(
        file=FSDP2,
        name="renamed_by_rank_1",
        why="rank 1 renames the finished folder: on one rank nobody does, and the checkpoint "
        "never appears",
        old="""    if dist.get_rank() == 0:
        os.replace(temporary, final)
""",
        new="""    if dist.get_rank() == 1:
        os.replace(temporary, final)
""",
        caught_by="3_ranks_and_on_1",
        says=["was missing on rank(s) [0]"],
    ),
    dict(
        file=FSDP2,
        name="save_straight_into_place",
        why="dcp.save writes into folder/step-N itself: a crash leaves a checkpoint without "
        "its metadata, which latest() then picks",
        old="""    dcp.save(state, checkpoint_id=temporary)
    if dist.get_rank() == 0:
        os.replace(temporary, final)
""",
        new="""    dcp.save(state, checkpoint_id=final)
""",
        caught_by="cut_short",
    ),
    dict(
        file=FSDP2,
        name="optimizer_state_not_saved",
        why="only the model saved and loaded: AdamW starts again from empty moments",
        old="""    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(step)}""",
        new="""    state = {"model": model_state, "step": torch.tensor(step)}""",
        also=[
            dict(
                old="""    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)}""",
                new="""    state = {"model": model_state, "step": torch.tensor(0)}""",
            ),
            dict(
                old="""    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])  # fmt: skip
""",
                new="""    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=optim_state)  # fmt: skip
""",
            ),
        ],
        caught_by="resumes_on_3",
    ),
    dict(
        file=FSDP2,
        name="step_not_read_back",
        why="load() fills the model and the optimizer but reports step 0: the run repeats steps",
        old="""    return int(state["step"])""",
        new="    return 0",
        caught_by="resumes_on_3",
    ),
    # Not a TODO: a flag the grading runs away from its default, whose effect it must see.
    dict(
        name="fsdp_seed_ignored",
        file=FSDP,
        why="fsdp.py's --seed not used: every run starts from seed 0's weights",
        old="        torch.manual_seed(args.seed)  # the same initial weights on every rank\n",
        new="        torch.manual_seed(0)  # the same initial weights on every rank\n",
        caught_by="learns_in_bf16",
    ),
]

MUTANTS += [
    dict(
        file=FSDP,
        name="prefetch_position_not_advanced",
        why="the position in the recorded order never moves on: the same layer is prefetched "
        "again and again, the others gathered in their own pre-hooks",
        old="        self.position += 1\n",
        new="        self.position += 0\n",
        caught_by="travels_while",
        says=["gathered again"],
    ),
    dict(
        file=FSDP,
        name="last_layer_not_prefetched",
        why="the check that a next layer exists stops one short: the last layer's weight is "
        "gathered in its own pre-hook, overlapping nothing",
        old="        if not self.first_forward and self.position + 1 < len(self.order):\n",
        new="        if not self.first_forward and self.position + 2 < len(self.order):\n",
        caught_by="travels_while",
        says=["the last layers not prefetched"],
    ),
    dict(
        name="optimizer_torch_ignored",
        why="--optimizer torch parsed and ignored: ShardedOptimizer runs, the same numbers",
        old='    if args.optimizer == "sharded":\n',
        new='    if args.optimizer in ("sharded", "torch"):\n',
        caught_by="learns_and_shards_its_optimizer",
        says=("the flag must pick it",),
    ),
    dict(
        file=FSDP,
        name="prefetch_the_layer_after_next",
        why="the prefetch fetches the layer after next: a full weight held a layer longer",
        old="        if not self.first_forward and self.position + 1 < len(self.order):\n"
        "            nxt = self.order[self.position + 1]\n",
        new="        if not self.first_forward and self.position + 2 < len(self.order):\n"
        "            nxt = self.order[self.position + 2]\n",
        caught_by="travels_while",
        says=("the layer after next prefetched",),
    ),
    dict(
        file=FSDP,
        name="reduce_scatter_in_bf16",
        why="gradients reduce-scattered in the compute dtype: bf16 sums lose their low bits",
        old="        flat = grad.reshape(-1).float()  # reduce in fp32, whatever the compute dtype\n",
        new="        flat = grad.reshape(-1)\n",
        also=[
            dict(
                file=FSDP,
                old="        mine = torch.empty(flat.numel() // ctx.world, device=flat.device)\n",
                new="        mine = torch.empty(flat.numel() // ctx.world, device=flat.device,\n"
                "                           dtype=flat.dtype)\n",
            ),
            dict(
                file=FSDP,
                old="        return mine / ctx.world, None, None",
                new="        return mine.float() / ctx.world, None, None",
            ),
        ],  # fmt: skip
        caught_by="communicate_and_compute_in_that_dtype",
        says=("backward's reduce-scatters sent",),
    ),
    dict(
        file=FSDP,
        name="bytes_without_gradients",
        why="the printed bytes count the parameters but not their gradients",
        old="for t in (p, p.grad))",
        new="for t in (p,))",
        caught_by="half_the_bytes",
        says=("Likely cause: the gradients not counted",),
    ),
    dict(
        file=FSDP2,
        name="save_gathers_full_state_dicts",
        why="save() gathers full state dicts: every rank receives the whole model and moments",
        old="    model_state, optim_state = get_state_dict(model, optimizer)\n"
        '    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(step)}\n',
        new="    from torch.distributed.checkpoint.state_dict import StateDictOptions\n"
        "    full = StateDictOptions(full_state_dict=True)\n"
        "    model_state, optim_state = get_state_dict(model, optimizer, options=full)\n"
        '    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(step)}\n',
        caught_by="own_shards_and_returns",
        says=("full state dicts",),
    ),
    dict(
        file=FSDP2,
        name="save_returns_before_the_rename",
        why="no barrier after rank 0's rename: other ranks return before the folder exists",
        old="        os.replace(temporary, final)\n    dist.barrier()\n",
        new="        os.replace(temporary, final)\n",
        caught_by="own_shards_and_returns",
        says=("no dist.barrier() after rank 0's",),
    ),
    dict(
        file=FSDP2,
        name="load_without_set_state_dict",
        why="dcp.load fills the tensors in place, but the learning rate is never put back",
        old='    set_state_dict(model, optimizer, model_state_dict=state["model"],\n'
        '                   optim_state_dict=state["optim"])  # fmt: skip\n',
        new="",
        caught_by="resumes_on_3_and_on_1",
        says=("(set_state_dict)",),
    ),
]

ALTERNATIVES = [
    dict(
        name="keyword_collectives_and_live_state",
        why="MiniFSDP calls its collectives with keyword arguments; state_dict() hands out this "
        "rank's own state tensors live, as torch's AdamW.state_dict() does, and the others' "
        "as gathered",
        old="        state = {i: s for part in shards for i, s in part.items()}\n",
        new="        shards[self.rank] = shard  # this rank's own entries: its live tensors\n"
        "        state = {i: s for part in shards for i, s in part.items()}\n",
        also=[
            dict(
                file=FSDP,
                old="        work = dist.all_gather_into_tensor(buffer, send, async_op=True)\n",
                new="        work = dist.all_gather_into_tensor(\n"
                "            output_tensor=buffer, input_tensor=send, async_op=True\n"
                "        )\n",
            ),
            dict(
                file=FSDP,
                old="        dist.reduce_scatter_tensor(mine, flat)\n",
                new="        dist.reduce_scatter_tensor(output=mine, input=flat)\n",
            ),
        ],
    ),
    dict(
        name="contiguous_cut_and_all_gather",
        why="owners by cutting the parameter list where the bytes pass each rank's even share; "
        "the updated shards sent with one all_gather_object of the CPU tensors. MiniFSDP: "
        "all_gather and reduce_scatter with lists of the buffer's chunks (views, written in "
        "place), and the next layer found by its index in the recorded order. FSDP2: the "
        "units in one loop, the state dicts from their own functions, a visible temporary "
        "folder moved into place with shutil",
        old=(
            '        for p in sorted(group["params"], key=lambda p: -p.numel() * p.element_size()):\n'
            "            if p not in self.owner:\n"
            "                owner = min(range(self.world), key=self.owned_bytes.__getitem__)\n"
            "                self.owner[p] = owner\n"
            "                self.owned_bytes[owner] += p.numel() * p.element_size()\n"
        ),
        new="""        new = [p for p in group["params"] if p not in self.owner]
        total = sum(p.numel() * p.element_size() for p in new)
        done = 0
        for p in new:
            owner = min(self.world - 1, int(done * self.world // max(total, 1)))
            self.owner[p] = owner
            self.owned_bytes[owner] += p.numel() * p.element_size()
            done += p.numel() * p.element_size()
""",
        also=[
            dict(
                old="""        works = [
            dist.broadcast(p, src=self.owner[p], async_op=True)
            for group in self.param_groups
            for p in group["params"]
        ]
        for work in works:
            work.wait()
""",
                new="""        params = list(dict.fromkeys(p for g in self.param_groups for p in g["params"]))
        mine = [p.detach().cpu() if self.owner[p] == self.rank else 0 for p in params]
        everyone = [None] * self.world
        dist.all_gather_object(everyone, mine)
        for i, p in enumerate(params):
            p.copy_(everyone[self.owner[p]][i])
""",
            ),
            dict(
                file=FSDP,
                old="        work = dist.all_gather_into_tensor(buffer, send, async_op=True)\n",
                new="        work = dist.all_gather(list(buffer.chunk(self.world)), send, async_op=True)\n",
            ),
            dict(
                file=FSDP,
                old="        dist.reduce_scatter_tensor(mine, flat)\n",
                new="        dist.reduce_scatter(mine, list(flat.chunk(ctx.world)))\n",
            ),
            dict(
                file=FSDP,
                old="        if not self.first_forward and self.position + 1 < len(self.order):\n            nxt = self.order[self.position + 1]\n            self.pending[nxt] = self._start_gather(nxt)\n        self.position += 1\n",
                new="        at = self.order.index(layer)\n        if not self.first_forward and at + 1 < len(self.order):\n            self.pending[self.order[at + 1]] = self._start_gather(self.order[at + 1])\n",
            ),
            dict(
                file=FSDP2,
                old="""    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
""",
                new="""    settings = dict(
        mesh=mesh,
        mp_policy=MixedPrecisionPolicy(compute_dtype, torch.float32),
        reshard_after_forward=reshard,
    )
    for unit in [*model.blocks, model]:  # the root last
        fully_shard(unit, **settings)
""",
            ),
            dict(
                file=FSDP2,
                old="from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict\n",
                new=(
                    "from torch.distributed.checkpoint.state_dict import (\n"
                    "    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,\n"
                    "    set_optimizer_state_dict, get_state_dict, set_state_dict,\n"
                    ")\n"
                ),
            ),
            dict(
                file=FSDP2,
                old="""    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(step)}
    dcp.save(state, checkpoint_id=temporary)
    if dist.get_rank() == 0:
        os.replace(temporary, final)
    dist.barrier()
""",
                new="""    writing = folder / f"incomplete-{step}"  # not step-*: latest() never sees it
    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
        "step": torch.tensor(step),
    }
    dcp.save(state, checkpoint_id=writing)
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.move(writing, final)
    dist.barrier()
""",
            ),
            dict(
                file=FSDP2,
                old="""    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])  # fmt: skip
    return int(state["step"])
""",
                new="""    step = torch.zeros((), dtype=torch.int64)
    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
        "step": step,
    }
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    return state["step"].item()
""",
            ),
        ],
    ),
]
