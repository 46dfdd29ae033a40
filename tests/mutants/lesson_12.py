"""Realistic wrong versions of lesson 12 (checkpoint.py: checkpointing by hand, full and
selective; ring.py: the zig-zag split, the online-softmax merge, the ring forward and
backward, the all-gather baseline), the two shortcuts, and an honest different version.

Format: see lesson_03.py.
"""

FILE = "12_long_sequences/checkpoint.py"
RING = "12_long_sequences/ring.py"

MUTANTS = [
    dict(
        name="rng_saved_after_forward",
        why="the random state kept after the block ran: the recompute draws the next "
        "dropout masks, not the ones forward used",
        old="        ctx.block, ctx.rng = block, torch.get_rng_state()\n"
        "        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.is_cuda else None\n"
        "        ctx.save_for_backward(x)\n        with torch.no_grad():\n"
        "            return block(x)\n",
        new="        ctx.save_for_backward(x)\n        with torch.no_grad():\n"
        "            out = block(x)\n"
        "        ctx.block, ctx.rng = block, torch.get_rng_state()\n"
        "        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.is_cuda else None\n"
        "        return out\n",
        caught_by="bit_for_bit",
    ),
    dict(
        name="random_stream_not_put_back",
        why="the random state set for the recompute and left there: the next step's "
        "dropout masks repeat this step's (only step 2 differs)",
        old="        with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []), "
        "torch.enable_grad():\n",
        new="        with torch.enable_grad():\n",
        caught_by="bit_for_bit",
        says=["fork_rng"],
    ),
    dict(
        name="output_gradient_returned_as_input_gradient",
        why="backward returns the gradient it was given as the input's: the block's own "
        "derivative skipped",
        old="        return None, x.grad\n",
        new="        return None, grad\n",
        caught_by="bit_for_bit",
    ),
    dict(
        name="torch_checkpoint_as_by_hand",
        why="Checkpoint.apply is torch.utils.checkpoint's: the exercise done by the library",
        old="class Checkpoint(torch.autograd.Function):\n",
        new="class Checkpoint(torch.autograd.Function):\n"
        "    apply = staticmethod(lambda block, x: checkpoint(block, x, use_reentrant=False))\n",
        caught_by="bit_for_bit",
        says=["used checkpoint from PyTorch's library"],
    ),
    dict(
        name="checkpoint_function_as_by_hand",
        why="Checkpoint.apply is the reentrant checkpoint's own Function: the library again",
        old="class Checkpoint(torch.autograd.Function):\n",
        new="class Checkpoint(torch.autograd.Function):\n"
        "    apply = staticmethod(lambda block, x: __import__('torch.utils.checkpoint')\n"
        "                         .utils.checkpoint.CheckpointFunction.apply(block, True, x))\n",
        caught_by="bit_for_bit",
        says=["used CheckpointFunction from PyTorch's library"],
    ),
    dict(
        name="policy_saves_everything",
        why="every operator's output saved: no checkpointing left, the bytes of none",
        old="    return CheckpointPolicy.MUST_SAVE if op in MATMULS else "
        "CheckpointPolicy.PREFER_RECOMPUTE\n",
        new="    return CheckpointPolicy.MUST_SAVE\n",
        caught_by="selective_keeps",
    ),
    dict(
        name="selective_without_the_policy",
        why="selective run as full checkpointing: the matmuls computed again in backward",
        old="        return checkpoint(block, x, use_reentrant=False, context_fn=contexts)\n",
        new="        return checkpoint(block, x, use_reentrant=False)\n",
        caught_by="selective_keeps",
    ),
    dict(
        name="full_checkpoint_reentrant",
        why="full checkpointing without use_reentrant=False: torch's default, the reentrant "
        "one, gives the blocks no gradient where the stack's input needs none",
        old="        return checkpoint(block, x, use_reentrant=False)\n",
        new="        return checkpoint(block, x)\n",
        caught_by="needs_no_input",
        says=["reentrant"],
    ),
    dict(
        file=RING,
        name="zigzag_neighbours",
        why="zig-zag as two neighbouring chunks (2r and 2r + 1): exact, but the last rank "
        "still attends to almost everything",
        old='    return [rank] if split == "plain" else [rank, 2 * world - 1 - rank]\n',
        new='    return [rank] if split == "plain" else [2 * rank, 2 * rank + 1]\n',
        caught_by="balances",
    ),
    dict(
        name="selective_crashes",
        why="the selective policy's context built once and passed as context_fn: checkpoint "
        "calls it, and it raises; full, written right, keeps its points",
        old="        return checkpoint(block, x, use_reentrant=False, context_fn=contexts)\n",
        new="        return checkpoint(block, x, use_reentrant=False, context_fn=contexts())\n",
        caught_by="same_gradients",
        spares="same_gradients and full",
        says=["run_block(block, x, 'selective') raised"],
    ),
    dict(
        file=RING,
        name="keys_labelled_from_the_wrong_neighbour",
        why="the keys that arrive at step s taken as rank + s's, where they come from rank - "
        "s: at 2 ranks the same neighbour, at 3 or more the wrong chunk's causal mask",
        old="            theirs = chunks_of((rank - step) % world, world, split)\n",
        new="            theirs = chunks_of((rank + step) % world, world, split)\n",
        caught_by="equals_attention_over_the_whole_sequence",
    ),
    dict(
        file=RING,
        name="merge_without_renormalising",
        why="the two parts added as they are: each was normalised by its own keys only",
        old="    return out * (lse - new).exp() + block_out * (block_lse - new).exp(), new\n",
        new="    return out + block_out, new\n",
        caught_by="chunks_and_merge",
    ),
    dict(
        file=RING,
        name="keys_never_move_on",
        why="the received block never replaces the held one: every step attends to the "
        "rank's own keys again",
        old="                kv = incoming\n        ### END SOLUTION\n",
        new="        ### END SOLUTION\n",
        caught_by="equals_attention",
    ),
    dict(
        file=RING,
        name="a_hop_after_the_last_step",
        why="keys and values sent on after the last step too: N hops, one more than the ring needs",
        old="            if step < world - 1:\n                incoming = torch.empty_like(kv)\n",
        new="            if True:\n                incoming = torch.empty_like(kv)\n",
        also=[
            dict(
                old="            if step < world - 1:\n                for request in hop:\n",
                new="            if True:\n                for request in hop:\n",
            )
        ],
        caught_by="one_neighbour",
    ),
    dict(
        file=RING,
        name="gradients_not_carried_home",
        why="no last hop in backward: each rank keeps its neighbour's key and value "
        "gradients as its own",
        old="            outgoing = travel if step < world - 1 else travel[2:].contiguous()\n"
        "            incoming = torch.empty_like(outgoing)\n"
        "            hop = [dist.isend(outgoing, after), dist.irecv(incoming, before)]\n"
        "            for request in hop:\n                request.wait()\n"
        "            travel = incoming\n",
        new="            if step < world - 1:\n"
        "                incoming = torch.empty_like(travel)\n"
        "                hop = [dist.isend(travel, after), dist.irecv(incoming, before)]\n"
        "                for request in hop:\n                    request.wait()\n"
        "                travel = incoming\n",
        caught_by="equals_attention",
        says=["carried home"],
    ),
    dict(
        file=RING,
        name="ring_by_all_gather",
        why="every rank's keys and values gathered at once inside the ring: the right "
        "numbers at N times the memory, the all-gather baseline under the ring's name",
        old="        kv, after, before = torch.stack([k, v]), (rank + 1) % world, (rank - 1) % world\n"
        "        for step in range(world):\n",
        new="        every = AllGather.apply(torch.stack([k, v]))\n"
        "        for source in range(world):\n"
        "            accumulate(qs, out, lse, every[source, 0], every[source, 1], mine,\n"
        "                       chunks_of(source, world, split))\n"
        "        for step in range(0):\n",
        caught_by="equals_attention",
        says=["all-gather baseline"],
    ),
    dict(
        file=RING,
        name="gather_copies_itself",
        why="the 'gathered' stack is this rank's own keys and values world times",
        old="        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]\n"
        "        dist.all_gather(parts, x.contiguous())\n        return torch.stack(parts)\n",
        new="        return torch.stack([x] * dist.get_world_size())\n",
        caught_by="all_gather_baseline",
    ),
    dict(
        file=RING,
        name="gather_gradient_not_summed",
        why="the gathered keys' gradient taken from this rank's slot only: the other "
        "ranks' queries' share lost",
        old="        mine = torch.empty_like(grad[0]).view(-1)\n"
        "        dist.reduce_scatter_tensor(mine, grad.contiguous().view(-1))\n"
        "        return mine.view_as(grad[0])\n",
        new="        return grad[dist.get_rank()].clone()\n",
        caught_by="all_gather_baseline",
    ),
    dict(
        file=RING,
        name="gather_gradient_all_reduced",
        why="every slot's sum all-reduced onto every rank, one kept: right numbers, twice "
        "the bytes of the all-gather's adjoint",
        old="        mine = torch.empty_like(grad[0]).view(-1)\n"
        "        dist.reduce_scatter_tensor(mine, grad.contiguous().view(-1))\n"
        "        return mine.view_as(grad[0])\n",
        new="        grad = grad.contiguous().clone()\n        dist.all_reduce(grad)\n"
        "        return grad[dist.get_rank()]\n",
        caught_by="all_gather_baseline",
        says=("twice a reduce-scatter's",),
    ),
]

MUTANTS += [
    dict(
        name="checkpoint_ignores_the_cuda_generator",
        why="only the CPU generator saved and set: on a GPU the recompute drops other units",
        old="        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.is_cuda else None\n",
        new="        ctx.cuda_rng = None\n",
        also=[
            dict(
                old="fork_rng(devices=[x.device] if x.is_cuda else [])", new="fork_rng(devices=[])"
            )
        ],  # fmt: skip
        caught_by="restores_the_cuda_generator",
        says=("another state of the CUDA generator",),
        gpus=1,
    ),
]

MUTANTS += [
    dict(
        name="ring_waits_before_attending",
        file=RING,
        why="each hop waited for before attending: the same bytes, nothing overlapped",
        old="            theirs = chunks_of((rank - step) % world, world, split)\n"
        "            accumulate(qs, out, lse, kv[0], kv[1], mine, theirs)\n"
        "            if step < world - 1:\n"
        "                for request in hop:\n"
        "                    request.wait()\n"
        "                kv = incoming\n",
        new="            if step < world - 1:\n"
        "                for request in hop:\n"
        "                    request.wait()\n"
        "            theirs = chunks_of((rank - step) % world, world, split)\n"
        "            accumulate(qs, out, lse, kv[0], kv[1], mine, theirs)\n"
        "            if step < world - 1:\n"
        "                kv = incoming\n",
        caught_by="attends_while_the_next_block_travels",
        says=("overlaps nothing",),
    ),
    dict(
        name="ring_keeps_every_block_then_attends",
        file=RING,
        why="every block kept as it arrives, all attended after the ring: N blocks held at "
        "once, and nothing overlapped",
        old="            theirs = chunks_of((rank - step) % world, world, split)\n"
        "            accumulate(qs, out, lse, kv[0], kv[1], mine, theirs)\n"
        "            if step < world - 1:\n"
        "                for request in hop:\n"
        "                    request.wait()\n"
        "                kv = incoming\n",
        new="            kept.append((kv, chunks_of((rank - step) % world, world, split)))\n"
        "            if step < world - 1:\n"
        "                for request in hop:\n"
        "                    request.wait()\n"
        "                kv = incoming\n"
        "        for block, theirs in kept:\n"
        "            accumulate(qs, out, lse, block[0], block[1], mine, theirs)\n",
        also=[
            dict(
                file=RING,
                old="        for step in range(world):\n            if step < world - 1:\n"
                "                incoming = torch.empty_like(kv)\n",
                new="        kept = []\n        for step in range(world):\n"
                "            if step < world - 1:\n"
                "                incoming = torch.empty_like(kv)\n",
            )
        ],  # fmt: skip
        caught_by="attends_while_the_next_block_travels",
    ),
]

ALTERNATIVES = [
    dict(
        name="the_other_way_round",
        why="The ring turned the other way (keys travel to rank - 1, with "
        "batch_isend_irecv) and keys and values as two messages a hop; the merge with "
        "the larger log-sum-exp taken out; zig-zag built with a list; the baseline's "
        "backward by the list form of reduce-scatter. Checkpointing: the "
        "random state from torch.random, backward through out.backward, and the policy "
        "matched on the operator's packet",
        file=RING,
        old="        kv, after, before = torch.stack([k, v]), (rank + 1) % world, (rank - 1) % world\n"
        "        for step in range(world):\n"
        "            if step < world - 1:\n"
        "                incoming = torch.empty_like(kv)\n"
        "                hop = [dist.isend(kv, after), dist.irecv(incoming, before)]\n"
        "            theirs = chunks_of((rank - step) % world, world, split)\n"
        "            accumulate(qs, out, lse, kv[0], kv[1], mine, theirs)\n"
        "            if step < world - 1:\n"
        "                for request in hop:\n"
        "                    request.wait()\n"
        "                kv = incoming\n",
        new="        keys, values = k, v\n"
        "        to, frm = (rank - 1) % world, (rank + 1) % world\n"
        "        for step in range(world):\n"
        "            if step + 1 < world:\n"
        "                new_k, new_v = torch.empty_like(keys), torch.empty_like(values)\n"
        "                ops = [dist.P2POp(dist.isend, keys.contiguous(), to),\n"
        "                       dist.P2POp(dist.isend, values.contiguous(), to),\n"
        "                       dist.P2POp(dist.irecv, new_k, frm),\n"
        "                       dist.P2POp(dist.irecv, new_v, frm)]\n"
        "                requests = dist.batch_isend_irecv(ops)\n"
        "            source = (rank + step) % world\n"
        "            accumulate(qs, out, lse, keys, values, mine, chunks_of(source, world, split))\n"
        "            if step + 1 < world:\n"
        "                for request in requests:\n"
        "                    request.wait()\n"
        "                keys, values = new_k, new_v\n",
        also=[
            dict(
                file=RING,
                old="        after, before = (rank + 1) % world, (rank - 1) % world\n"
                "        for step in range(world):\n"
                "            theirs = chunks_of((rank - step) % world, world, ctx.split)\n",
                new="        after, before = (rank - 1) % world, (rank + 1) % world\n"
                "        for step in range(world):\n"
                "            theirs = chunks_of((rank + step) % world, world, ctx.split)\n",
            ),
            dict(
                file=RING,
                old="    new = torch.logaddexp(lse, block_lse)\n"
                "    return out * (lse - new).exp() + block_out * (block_lse - new).exp(), new\n",
                new="    top = torch.maximum(lse, block_lse)\n"
                "    a, b = (lse - top).exp(), (block_lse - top).exp()\n"
                "    return (out * a + block_out * b) / (a + b), top + (a + b).log()\n",
            ),
            dict(  # the all-gather's adjoint by the list form of reduce-scatter
                file=RING,
                old="        mine = torch.empty_like(grad[0]).view(-1)\n"
                "        dist.reduce_scatter_tensor(mine, grad.contiguous().view(-1))\n"
                "        return mine.view_as(grad[0])\n",
                new="        mine = torch.empty_like(grad[0])\n"
                "        dist.reduce_scatter(mine, list(grad.contiguous().unbind(0)))\n"
                "        return mine\n",
            ),
            dict(
                file=RING,
                old='    return [rank] if split == "plain" else [rank, 2 * world - 1 - rank]\n',
                new='    chunks = [rank]\n    if split == "zigzag":\n'
                "        chunks.append(2 * world - 1 - rank)\n    return chunks\n",
            ),
            dict(
                file=FILE,
                old="        ctx.block, ctx.rng = block, torch.get_rng_state()\n",
                new="        ctx.block, ctx.rng = block, torch.random.get_rng_state()\n",
            ),
            dict(
                file=FILE,
                old="        torch.autograd.backward(out, grad)\n",
                new="        out.backward(grad)\n",
            ),
            dict(
                file=FILE,
                old="    return CheckpointPolicy.MUST_SAVE if op in MATMULS else "
                "CheckpointPolicy.PREFER_RECOMPUTE\n",
                new="    packets = (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm)\n"
                "    if op.overloadpacket in packets:\n"
                "        return CheckpointPolicy.MUST_SAVE\n"
                "    return CheckpointPolicy.PREFER_RECOMPUTE\n",
            ),
        ],
    ),
]
