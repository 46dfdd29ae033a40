"""Realistic wrong versions of lesson 04 (torchrun, snapshots), and an honest different one.

Format: see lesson_03.py.
"""

FILE = "04_torchrun/train.py"

MUTANTS = [
    dict(
        name="done_before_forgotten",
        why="the resumed epoch's earlier batches are not counted in later snapshots",
        old="done_before, skip = skip, 0",
        new="done_before, skip = 0, 0",
        caught_by="second_crash",
    ),
    dict(
        name="skip_in_batches",
        why="sampler.skip given batches instead of indices: the restart repeats batches",
        old="sampler.skip = skip * args.batch_size",
        new="sampler.skip = skip",
        caught_by="killed_rank_is_restarted",
    ),
    dict(
        name="snapshot_written_in_place",
        why="torch.save straight onto the snapshot: a crash mid-write destroys it",
        old="        checkpoint.save(state, path)\n",
        new="        torch.save(state, path)\n",
        caught_by="kill_during_snapshot",
    ),
]

ALTERNATIVES = [
    dict(
        name="own_atomic_snapshot",
        why="the snapshot written with torch.save to a temporary file, fsync, os.replace",
        old="        checkpoint.save(state, path)\n",
        new="""        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
""",
    ),
]
