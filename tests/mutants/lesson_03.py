"""Realistic wrong versions of lesson 03 (mp.spawn DDP), and an honest different one.

Each entry rewrites the reference solution: `old` must appear exactly once in
solutions/03_ddp_spawn/train.py and becomes `new`. A mutant must be rejected
by the tests whose names contain `caught_by`; an alternative must pass every
test of the lesson. An entry may carry `also`, more old/new edits of the same
submission (two honest rewrites of different TODOs graded in one run).
tests/mutants/test_mutants.py applies them.
"""

FILE = "03_ddp_spawn/train.py"

MUTANTS = [
    dict(
        name="rank_not_passed",
        why="init_process_group without rank=: the env:// default finds no RANK variable",
        old="dist.init_process_group(backend, rank=rank, world_size=world_size,",
        new="dist.init_process_group(backend, world_size=world_size,",
        caught_by="train_function",
    ),
    dict(
        name="every_rank_saves",
        why="all ranks write the checkpoint: N writers race on one file",
        old="        if rank == 0 and args.checkpoint and complete:",
        new="        if args.checkpoint and complete:",
        caught_by="saves_on_rank_0_only",
    ),
    dict(
        name="no_set_epoch",
        why="sampler.set_epoch forgotten: every epoch reuses epoch 0's order",
        old="        sampler.set_epoch(epoch)\n",
        new="        pass\n",
        caught_by="own_shard_every_epoch",
    ),
    dict(
        name="sampler_without_rank",
        why="DistributedSampler built without rank=: both ranks train on one half",
        old="DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)",
        new="DistributedSampler(train_set, num_replicas=world_size, rank=0, seed=args.seed)",
        caught_by="own_shard_every_epoch",
    ),
    dict(
        name="data_parallel_instead_of_ddp",
        why="DataParallel (lesson 02) instead of DDP: each rank trains its own replica",
        old="    model = DDP(model, device_ids=",
        new="    model = nn.DataParallel(model)\n    _options_left_over = dict(device_ids=",
        caught_by="matches_the_graders",
    ),
    dict(
        name="fixed_master_port",
        why="a hard-coded MASTER_PORT: two jobs on one machine collide",
        old='os.environ["MASTER_PORT"] = str(port)',
        new='os.environ["MASTER_PORT"] = "29533"',
        caught_by="choose_their_own_ports",
    ),
    dict(
        name="gradients_never_cleared",
        why="no optimizer.zero_grad(): gradients pile up (the replicas still agree)",
        old="        optimizer.zero_grad(set_to_none=True)\n",
        new="",
        caught_by="matches_the_graders",
    ),
    # Not a TODO: flags the grading runs away from their defaults, whose effect it must see.
    dict(
        name="seed_ignored",
        why="--seed read but not used for the weights: every run starts from seed 0's",
        old="    seed_everything(args.seed)  # the same seed on every rank",
        new="    seed_everything(0)  # the same seed on every rank",
        caught_by="matches_the_graders",
    ),
    dict(
        name="lr_ignored",
        why="--lr read but not used: the optimizer keeps the default 0.05",
        old="lr=args.lr, momentum=0.9",
        new="lr=0.05, momentum=0.9",
        caught_by="matches_the_graders",
    ),
]

ALTERNATIVES = [
    dict(
        name="own_atomic_torch_save",
        why="the checkpoint written with torch.save to a temporary file, fsync, os.replace",
        old="""            save(state, args.checkpoint)""",
        new="""            tmp = args.checkpoint + ".partial"
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, args.checkpoint)""",
    ),
]
