"""Realistic wrong versions of lesson 13 (moe.py: routing, capacity, the balancing loss, the
combine; experts.py: the all-to-all and its backward, the dispatch, the gradient
averaging), the gather shortcut, and an honest different version.

Format: see lesson_03.py.
"""

FILE = "13_experts/moe.py"
EP = "13_experts/experts.py"

MUTANTS = [
    dict(
        name="every_token_through_every_expert",
        why="each expert run on every token and its output masked by the kept choices: the "
        "same numbers, at E / k times the compute",
        old="            out.index_add_(0, tokens, expert(x[tokens]) * gates[tokens, slots, None])\n",
        new="            every = expert(x)\n"
        "            out.index_add_(0, tokens, every[tokens] * gates[tokens, slots, None])\n",
        caught_by="computes_what_the_graders",
        says=["every token run through every expert"],
    ),
    dict(
        name="gates_not_renormalised",
        why="the chosen probabilities used as they are: each token's gates sum to less than 1",
        old="    return probs, top / top.sum(-1, keepdim=True), experts\n",
        new="    return probs, top, experts\n",
        caught_by="route_picks",
    ),
    dict(
        name="capacity_token_by_token",
        why="choices numbered token by token: a token's second choice takes an expert's "
        "place before a later token's first",
        old="    hot = F.one_hot(experts.T.reshape(-1), n_experts)\n"
        "    place = ((hot.cumsum(0) - hot) * hot).sum(-1)  # earlier choices of the same expert\n"
        "    return (place < cap).view(experts.shape[1], -1).T\n",
        new="    hot = F.one_hot(experts.reshape(-1), n_experts)\n"
        "    place = ((hot.cumsum(0) - hot) * hot).sum(-1)\n"
        "    return (place < cap).view(experts.shape)\n",
        caught_by="capacity_keeps",
    ),
    dict(
        name="balance_over_first_choices",
        why="the shares counted over each token's first choice only",
        old="    share = torch.bincount(experts.flatten(), minlength=n_experts) / experts.numel()\n",
        new="    share = torch.bincount(experts[:, 0], minlength=n_experts) / len(experts)\n",
        caught_by="balance_loss_is",
    ),
    dict(
        name="balance_without_a_place_for_every_expert",
        why="the choices counted by bincount without minlength: when the last expert gets no "
        "choice, the shares are one short and no longer line up with the experts (found by "
        "the mutation engine)",
        old="    share = torch.bincount(experts.flatten(), minlength=n_experts) / experts.numel()\n",
        new="    share = torch.bincount(experts.flatten()) / experts.numel()\n",
        caught_by="balance_loss_is",
        says=["must match the size of tensor b"],  # the crash, in the case child, named
    ),
    dict(
        file=EP,
        name="counts_without_a_place_for_every_expert",
        why="the dispatch's counts by bincount without minlength: a rank that sends the last "
        "expert nothing has one count too few, and the exchange of counts breaks (found by "
        "the mutation engine)",
        old="        counts = torch.bincount(experts[tokens, slots], minlength=self.n)\n",
        new="        counts = torch.bincount(experts[tokens, slots])\n",
        caught_by="one_process_computes",
    ),
    dict(
        name="balance_without_gradient",
        why="the mean probabilities detached: the balancing loss has the right value and "
        "no effect on the router",
        old="    return n_experts * (share * probs.mean(0)).sum()\n",
        new="    return n_experts * (share * probs.mean(0).detach()).sum()\n",
        caught_by="evens_the_load",
    ),
    dict(
        name="combine_without_gates",
        why="the experts' outputs added without their gates: the router gets no gradient "
        "from the task and every chosen expert counts fully",
        old="            out.index_add_(0, tokens, expert(x[tokens]) * gates[tokens, slots, None])\n",
        new="            out.index_add_(0, tokens, expert(x[tokens]))\n",
        caught_by="layer_computes",
    ),
    dict(
        file=EP,
        name="all_to_all_splits_swapped",
        why="all_to_all_single's output and input splits given the other way round",
        old="        dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)\n",
        new="        dist.all_to_all_single(out, x.contiguous(), send, receive, group=group)\n",
        caught_by="one_process_computes",
    ),
    dict(
        file=EP,
        name="gradients_not_sent_back",
        why="backward returns the received rows' gradients where they are: each rank keeps "
        "gradients of other ranks' tokens",
        old="        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))\n"
        "        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.receive, "
        "group=ctx.group)\n        return back, None, None, None\n",
        new="        return grad[: sum(ctx.send)], None, None, None\n",
        caught_by="one_process_computes",
    ),
    dict(
        file=EP,
        name="rows_not_sorted_by_expert",
        why="the kept choices sent in token order: the rows for one owner are not "
        "contiguous, and the wrong rows reach each rank",
        old="        order = experts[tokens, slots].argsort(stable=True)\n",
        new="        order = torch.arange(len(tokens))\n",
        caught_by="one_process_computes",
    ),
    dict(
        file=EP,
        name="every_token_gathered",
        why="every rank's tokens gathered to every rank first: N times the bytes",
        old="        inbox = AllToAll.apply(x[tokens], send, receive, self.group)\n",
        new="        everyone = [torch.empty_like(x) for _ in range(dist.get_world_size(self.group))]\n"
        "        dist.all_gather(everyone, x.contiguous(), group=self.group)\n"
        "        inbox = AllToAll.apply(x[tokens], send, receive, self.group)\n",
        caught_by="tokens_travel",
        says=["refused"],
    ),
    dict(
        file=EP,
        name="counts_gathered_to_everyone",
        why="every rank's counts all-gathered, and this rank's column read from them: the "
        "right counts, but a collective the exchange does not need",
        old="        dist.all_to_all_single(arrived, counts, group=self.group)\n",
        new="        ranks = dist.get_world_size(self.group)\n"
        "        everyone = [torch.empty_like(counts) for _ in range(ranks)]\n"
        "        dist.all_gather(everyone, counts, group=self.group)\n"
        "        me = dist.get_rank(self.group)\n"
        "        arrived = torch.cat([c.view(ranks, self.per)[me] for c in everyone])\n",
        caught_by="tokens_travel",
        says=["counts are exchanged by all-to-all too"],
    ),
    dict(
        file=EP,
        name="experts_divided_by_their_group",
        why="each expert's gradient divided by the ranks holding it, not the world: its "
        "ranks' losses are each their own tokens' mean, so it is 2 times too large",
        old="        p.grad /= world\n",
        new="        p.grad /= dist.get_world_size(same_experts if id(p) in mine else None)\n",
        caught_by="right_groups",
    ),
    dict(
        file=EP,
        name="experts_summed_over_everyone",
        why="every gradient summed over every rank: ranks holding other experts add theirs "
        "into this rank's experts",
        old="        dist.all_reduce(p.grad, group=same_experts if id(p) in mine else None)\n",
        new="        dist.all_reduce(p.grad)\n",
        caught_by="right_groups",
    ),
]

MUTANTS += [
    dict(
        name="differentiable_all_to_all_of_torch",
        file=EP,
        why="AllToAll is torch.distributed.nn.functional's differentiable all-to-all: the "
        "exercise done by the library",
        old="class AllToAll(torch.autograd.Function):\n",
        new="class AllToAll(torch.autograd.Function):\n"
        "    apply = staticmethod(lambda x, send, receive, group: __import__(\n"
        "        'torch.distributed.nn.functional', fromlist=['f']).all_to_all_single(\n"
        "        x.new_empty((sum(receive), *x.shape[1:])), x.contiguous(), receive, send,\n"
        "        group=group))\n",
        caught_by="expert_parallel_computes_what_one_process",
        says=("used torch.distributed.nn.functional.all_to_all_single",),
    ),
    dict(
        name="list_form_all_to_all_on_gloo",
        file=EP,
        why="dist.all_to_all's list form, right on nccl, impossible on gloo with uneven "
        "pieces: the grade must say why rather than show gloo's size error",
        old="        dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)\n"
        "        return out\n",
        new="        outs = [x.new_empty((r, *x.shape[1:])) for r in receive]\n"
        "        dist.all_to_all(outs, list(x.contiguous().split(send)), group=group)\n"
        "        return torch.cat(outs)\n",
        caught_by="expert_parallel_computes_what_one_process",
        says=("the list form works on nccl",),
    ),
]

ALTERNATIVES = [
    dict(
        name="lists_and_loops",
        why="Routing by sorting; capacity counted in a loop; the balancing loss from one-hot "
        "means; the all-to-all over lists of tensors (dist.all_to_all), its backward too; "
        "the counts exchanged as int32; the dense gradients averaged in one flat all-reduce",
        old="    probs = logits.softmax(-1)\n    top, experts = probs.topk(k, dim=-1)\n",
        new="    probs = logits.softmax(-1)\n"
        "    ordered, index = probs.sort(dim=-1, descending=True)\n"
        "    top, experts = ordered[:, :k], index[:, :k]\n",
        also=[
            dict(
                old="    hot = F.one_hot(experts.T.reshape(-1), n_experts)\n"
                "    place = ((hot.cumsum(0) - hot) * hot).sum(-1)  # earlier choices of the "
                "same expert\n"
                "    return (place < cap).view(experts.shape[1], -1).T\n",
                new="    taken = [0] * n_experts\n"
                "    keep = torch.zeros(experts.shape, dtype=torch.bool)\n"
                "    for slot in range(experts.shape[1]):\n"
                "        for token in range(experts.shape[0]):\n"
                "            e = int(experts[token, slot])\n"
                "            keep[token, slot] = taken[e] < cap\n"
                "            taken[e] += 1\n"
                "    return keep\n",
            ),
            dict(
                old="    share = torch.bincount(experts.flatten(), minlength=n_experts) / "
                "experts.numel()\n",
                new="    share = F.one_hot(experts, n_experts).float().mean((0, 1))\n",
            ),
            dict(
                old="            out.index_add_(0, tokens, expert(x[tokens]) * "
                "gates[tokens, slots, None])\n",
                new="            y = expert(x[tokens]) * gates[tokens, slots].unsqueeze(-1)\n"
                "            out = out.index_put((tokens,), y, accumulate=True)\n",
            ),
            dict(
                file=EP,
                old="        order = experts[tokens, slots].argsort(stable=True)\n",
                new="        order = torch.sort(experts[tokens, slots], stable=True).indices\n",
            ),
            dict(
                file=EP,
                old="        out = x.new_empty((sum(receive), *x.shape[1:]))\n"
                "        dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)\n"
                "        return out\n",
                new="        ctx.splits = (send, receive, group)\n"
                "        out = torch.empty(sum(receive), *x.shape[1:], dtype=x.dtype)\n"
                "        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive,\n"
                "                               input_split_sizes=send, group=group)\n"
                "        return out\n",
            ),
            dict(
                file=EP,
                old="        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))\n"
                "        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.receive, "
                "group=ctx.group)\n        return back, None, None, None\n",
                new="        send, receive, group = ctx.splits\n"
                "        back = torch.empty(sum(send), *grad.shape[1:], dtype=grad.dtype)\n"
                "        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=send,\n"
                "                               input_split_sizes=receive, group=group)\n"
                "        return back, None, None, None\n",
            ),
            dict(
                file=EP,
                old="        counts = torch.bincount(experts[tokens, slots], minlength=self.n)\n",
                new="        counts = torch.bincount(experts[tokens, slots], minlength=self.n)"
                ".int()\n",
            ),
            dict(
                file=EP,
                old="    mine = {id(p) for p in experts_of_mine.parameters()}\n"
                "    for p in model.parameters():\n"
                "        dist.all_reduce(p.grad, group=same_experts if id(p) in mine else None)\n"
                "        p.grad /= world\n",
                new="    mine = {id(p) for p in experts_of_mine.parameters()}\n"
                "    dense = [p for p in model.parameters() if id(p) not in mine]\n"
                "    flat = torch.cat([p.grad.flatten() for p in dense])\n"
                "    dist.all_reduce(flat)\n"
                "    for p, g in zip(dense, flat.split([p.numel() for p in dense]), strict=True):\n"
                "        p.grad.copy_(g.view_as(p)).div_(world)\n"
                "    for p in experts_of_mine.parameters():\n"
                "        dist.all_reduce(p.grad, group=same_experts)\n"
                "        p.grad /= world\n",
            ),
        ],
    ),
]
