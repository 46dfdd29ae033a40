"""Realistic wrong versions of lesson 03 (mp.spawn DDP), and an honest different one.

Each entry rewrites the reference solution: `old` must appear exactly once in
solutions/03_ddp_spawn/train.py and becomes `new`. A mutant must be rejected
by the tests whose names contain `caught_by`; an alternative must pass every
test of the lesson. tests/test_mutants.py applies them.
"""

FILE = "03_ddp_spawn/train.py"

MUTANTS = [
    dict(
        name="every_rank_saves",
        why="all ranks write the checkpoint: N writers race on one file",
        old="if rank == 0 and args.checkpoint and complete:",
        new="if args.checkpoint and complete:",
        caught_by="only_rank_0_writes",
    ),
    dict(
        name="no_set_epoch",
        why="sampler.set_epoch forgotten: every epoch reuses epoch 0's order",
        old="        sampler.set_epoch(epoch)\n",
        new="        pass\n",
        caught_by="disjoint_shards",
    ),
    dict(
        name="sampler_without_rank",
        why="DistributedSampler built without rank=: both ranks train on one half",
        old="train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed",
        new="train_set, num_replicas=world_size, rank=0, shuffle=True, seed=args.seed",
        caught_by="disjoint_shards or global_batch",
    ),
    dict(
        name="gradients_never_cleared",
        why="no optimizer.zero_grad(): gradients pile up; two ranks still equal one process",
        old="        optimizer.zero_grad(set_to_none=True)\n",
        new="",
        caught_by="learn",
    ),
]

ALTERNATIVES = [
    dict(
        name="own_atomic_torch_save",
        why="the checkpoint written with torch.save to a temporary file, fsync, os.replace",
        old="""            checkpoint.save(
                checkpoint_state(model.module, optimizer, epoch + 1, step), args.checkpoint
            )""",
        new="""            tmp = args.checkpoint + ".partial"
            with open(tmp, "wb") as f:
                torch.save(checkpoint_state(model.module, optimizer, epoch + 1, step), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, args.checkpoint)""",
    ),
]
