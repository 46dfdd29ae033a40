"""Realistic wrong versions of lesson 04 (torchrun, snapshots), and an honest different one.

Format: see lesson_03.py.
"""

FILE = "04_torchrun/train.py"

MUTANTS = [
    dict(
        name="rank_from_local_rank",
        why="the global rank read from LOCAL_RANK: right on one machine, 0 twice on two",
        old='rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])',
        new='rank, world_size = local_rank, int(os.environ["WORLD_SIZE"])',
        caught_by="global_rank_from_torchruns",
    ),
    dict(
        name="data_parallel_instead_of_ddp",
        why="DataParallel (lesson 02) instead of DDP: each rank trains its own replica",
        old="    model = DDP(model, device_ids=",
        new="    model = torch.nn.DataParallel(model)\n    _options_left_over = dict(device_ids=",
        caught_by="resumed_twice",
    ),
    dict(
        name="optimizer_not_restored",
        why="load_snapshot forgets the optimizer: SGD resumes without its momentum",
        old='    optimizer.load_state_dict(state["optimizer"])\n',
        new="",
        caught_by="snapshot_restores",
    ),
    dict(
        name="world_size_not_checked",
        why="a 2-rank snapshot resumed by 1 rank: shards and batch positions no longer line up",
        old='    if state["world_size"] != world_size:\n',
        new="    if False:\n",
        caught_by="refuses_another_world_size",
    ),
    dict(
        name="done_reset_too_early",
        why="`done` reset with the skip: later snapshots in the resumed epoch miss its start",
        old="        sampler.skip = done * args.batch_size\n",
        new="        sampler.skip, done = done * args.batch_size, 0\n",
        caught_by="resumed_twice",
    ),
    dict(
        name="skip_in_batches",
        why="sampler.skip given batches instead of indices: the restart repeats batches",
        old="        sampler.skip = done * args.batch_size\n",
        new="        sampler.skip = done\n",
        caught_by="resumed_twice",
    ),
    dict(
        name="snapshot_written_in_place",
        why="torch.save straight onto the snapshot: a crash mid-write destroys it",
        old="        save(state, path)\n",
        new="        torch.save(state, path)\n",
        caught_by="put_in_place_by_a_rename",
    ),
]

ALTERNATIVES = [
    dict(
        name="own_atomic_snapshot",
        why="the snapshot written with torch.save to a temporary file, fsync, os.replace",
        old="        save(state, path)\n",
        new="""        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
""",
    ),
]
