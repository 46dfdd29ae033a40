"""Realistic wrong versions of lesson 10 (ShardedOptimizer, ZeRO stage 1), and honest
different ones.

Format: see lesson_03.py.
"""

FILE = "10_sharding/zero.py"

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
]

ALTERNATIVES = [
    dict(
        name="contiguous_cut_and_all_gather",
        why="owners by cutting the parameter list where the bytes pass each rank's even share; "
        "the updated shards sent with one all_gather_object of the CPU tensors",
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
            )
        ],
    ),
]
