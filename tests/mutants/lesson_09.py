"""Realistic wrong fixes of lesson 09's exercises, and honest different ones.

Format: see lesson_03.py. Lesson 09 has several files: a case's `file` names the one it
edits (default FILE), and so may each of its `also` edits. Putting an exercise's bug back
is the first mutant of each; the others are fixes that look right and are not.
"""

FILE = "09_debugging/oom.py"
HANG, SILENT, UNUSED = "09_debugging/hang.py", "09_debugging/silent.py", "09_debugging/unused.py"
RDZV, STARVED = "09_debugging/rendezvous.py", "09_debugging/starved.py"

MUTANTS = [
    # --- oom.py ---
    dict(
        name="oom_whole_batch_at_once",
        why="the bug itself: the whole batch through forward and backward at once",
        old="zip(images.split(micro_batch), labels.split(micro_batch), strict=True)",
        new="[(images, labels)]",
        caught_by="fits_the_budget",
    ),
    dict(
        name="oom_mean_over_micro_batches",
        why="each micro-batch's mean loss divided by their number: wrong when the last is smaller",
        old='        loss = F.cross_entropy(model(x), y, reduction="sum") / len(labels)\n',
        new=("        loss = F.cross_entropy(model(x), y) / len(images.split(micro_batch))\n"),
        caught_by="equals_the_whole_batch",
    ),
    dict(
        name="oom_step_every_micro_batch",
        why="the optimizer steps after every micro-batch: 8 small steps, not one",
        old="    optimizer.step()  # once: the step of the whole batch\n",
        new="        optimizer.step()\n",
        caught_by="equals_the_whole_batch",
    ),
    # --- unused.py ---
    dict(
        name="unused_head_kept",
        file=UNUSED,
        why="the bug itself: a head defined and never used",
        old="        ### FIX\n        ### END BUG\n",
        new="        self.aux = nn.Linear(2 * 32, classes)\n",
        caught_by="every_parameter",
    ),
    dict(
        name="unused_head_hidden_by_find_unused_parameters",
        file=UNUSED,
        why="find_unused_parameters=True: the run completes, the unused head is still there",
        old="        ### FIX\n        ### END BUG\n",
        new="        self.aux = nn.Linear(2 * 32, classes)\n",
        also=[
            dict(
                file=UNUSED,
                old="    model = DDP(Net())\n",
                new="    model = DDP(Net(), find_unused_parameters=True)\n",
            )
        ],  # fmt: skip
        caught_by="every_parameter",
    ),
    dict(
        name="unused_head_hidden_by_a_zero_weight",
        file=UNUSED,
        why="the head kept and used with weight zero: every parameter gets a gradient, a "
        "zero one, and DDP still all-reduces and the optimizer steps the dead layer",
        old="        ### FIX\n        ### END BUG\n",
        new="        self.aux = nn.Linear(2 * 32, classes)\n",
        also=[
            dict(
                file=UNUSED,
                old="        return self.body(x)\n",
                new="        return self.body(x) + 0.0 * self.aux(x.new_zeros(len(x), 2 * 32))\n",
            )
        ],  # fmt: skip
        caught_by="every_parameter",
        says=("zero gradient",),
    ),
    # --- hang.py ---
    dict(
        name="hang_own_shard_count",
        file=HANG,
        why="the bug itself: each rank counts its own shard's batches",
        old="    dist.all_reduce(steps, op=dist.ReduceOp.MIN)",
        new="    pass  #",
        caught_by="same_steps",
        says=("Timed out", "different numbers of steps"),
    ),
    dict(
        name="hang_counts_summed",
        file=HANG,
        why="all_reduce's default op, SUM: the ranks agree, on three times the steps",
        old="    dist.all_reduce(steps, op=dist.ReduceOp.MIN)",
        new="    dist.all_reduce(steps)",
        caught_by="same_steps",
    ),
    dict(
        name="diagnose_reads_the_checkers_collective",
        file=HANG,
        why="the op after 'but Rank N is running': another rank's fingerprint length read "
        "as an op (REDUCE, GATHER)",
        old=r'r"Rank (\d+) is running collective: [^)]*?OpType',
        new=r'r".*but Rank (\d+) is running collective: [^)]*?OpType',
        caught_by="diagnosis",
    ),
    dict(
        name="diagnose_answers_the_odd_ranks_own_collective",
        file=HANG,
        why="the collective the odd rank is in (its next one), not the one it missed",
        old="    return odd[0], OP_NAMES.get(common, common.lower())\n",
        new="    return odd[0], OP_NAMES.get(own[odd[0]], own[odd[0]].lower())\n",
        caught_by="diagnosis",
    ),
    dict(
        name="diagnose_odd_rank_is_in_the_barrier",
        file=HANG,
        why="the rank out of step taken to be the one waiting in a barrier: true only when "
        "it skipped the last collective before one",
        old="    odd = [rank for rank, op in own.items() if op != common]\n",
        new='    odd = [rank for rank, op in own.items() if op == "BARRIER"]\n',
        caught_by="diagnosis",
    ),
    dict(
        name="flight_records_first_entry",
        file=HANG,
        why="each rank's first entry read, not its last: the collective every rank began with",
        old='            last[rank] = (entries[-1]["collective_seq_id"], entries[-1]["profiling_name"])',
        new='            last[rank] = (entries[0]["collective_seq_id"], entries[0]["profiling_name"])',
        caught_by="flight_recorder_names",
    ),
    dict(
        name="flight_records_names_only",
        file=HANG,
        why="only the op compared: a rank that never reached the others' collective, its "
        "last one the same op, looks in step",
        old='            last[rank] = (entries[-1]["collective_seq_id"], entries[-1]["profiling_name"])',
        new='            last[rank] = (0, entries[-1]["profiling_name"])',
        caught_by="flight_recorder_names",
    ),
    dict(
        name="flight_records_sequence_only",
        file=HANG,
        why="only the sequence numbers compared: a rank in another op at the same number "
        "looks in step",
        old='            last[rank] = (entries[-1]["collective_seq_id"], entries[-1]["profiling_name"])',
        new='            last[rank] = (entries[-1]["collective_seq_id"], "gloo:all_reduce")',
        caught_by="flight_recorder_names",
    ),
    dict(
        name="flight_records_prefix_kept",
        file=HANG,
        why="the backend's prefix kept: \"gloo:all_reduce\" is not torch.distributed's name",
        old='    return odd[0], common[1].split(":")[-1]',
        new="    return odd[0], common[1]",
        caught_by="flight_recorder_names",
    ),
    # --- rendezvous.py ---
    dict(
        name="rdzv_defaults",
        file=RDZV,
        why="the bug itself: init_process_group's env:// defaults, 30 minutes of waiting",
        old="    if problem := interface_problem(backend):\n",
        new="    dist.init_process_group(backend)\n    if problem := interface_problem(backend):\n",
        caught_by="nobody_at_the_address",
        says=("s after importing torch (--timeout 3), and killed",),
    ),
    dict(
        name="rdzv_store_waits_for_its_workers",
        file=RDZV,
        why="rank 0's TCPStore waits for every worker to connect: a rank that never comes "
        "keeps it there for the store's own timeout (5 minutes), not --timeout",
        old="        store = dist.TCPStore(addr, port, world_size, rank == 0, wait_for_workers=False)\n",
        new="        store = dist.TCPStore(addr, port, world_size, rank == 0, wait_for_workers=True)\n",
        caught_by="never_comes",
        says=("wait_for_workers=True",),
    ),
    dict(
        name="rdzv_read_key_misnamed",
        file=RDZV,
        why="the read mark set with its key and value swapped: rank 0 waits for marks that "
        "never come, out to its --timeout, on every join (found by the mutation engine)",
        old='    store.set(f"read/{rank}", "")\n',
        new='    store.set("", f"read/{rank}")\n',
        caught_by="right_settings",
        says=("waits out its whole --timeout",),
    ),
    dict(
        name="rdzv_client_connects_without_waiting",
        file=RDZV,
        why="no wait for rank 0's port: TCPStore's own client retries for 5 minutes",
        old="    if rank > 0 and not wait_until(",
        new="    if False and not wait_until(",
        caught_by="nobody_at_the_address",
    ),
    dict(
        name="rdzv_port_in_use_called_unreachable",
        file=RDZV,
        why="every store error reported as 'nobody answered': a taken port is misnamed",
        old='        if "EADDRINUSE" in str(err):  # another job, or an old one still running\n'
        '            raise ConnectionError(f"MASTER_PORT {port} is in use here',
        new="        if True:\n"
        '            raise ConnectionError(f"nobody answered at {addr}:{port}',
        caught_by="port_in_use",
    ),
    dict(
        name="rdzv_world_sizes_not_compared",
        file=RDZV,
        why="the world sizes written but never compared: gloo's own timeout, a traceback",
        old="        if size != world_size:\n",
        new="        if size != world_size and False:\n",
        caught_by="mismatched_world_sizes",
    ),
    dict(
        name="rdzv_rank_0_reads_only_its_own",
        file=RDZV,
        why="every rank compares with rank 0's size only: rank 0 never sees the mismatch",
        old="(range(world_size) if rank == 0 else [0])",
        new="[0]",
        caught_by="mismatched_world_sizes",
    ),
    dict(
        name="rdzv_mismatch_ranks_swapped",
        file=RDZV,
        why="the mismatch reported with the two ranks swapped: each size given the other rank",
        old='                f"rank {other} was started with WORLD_SIZE={size}, rank {rank} with "',
        new='                f"rank {rank} was started with WORLD_SIZE={size}, rank {other} with "',
        caught_by="mismatched_world_sizes",
        says=("Likely cause: the two ranks swapped in the message",),
    ),
    dict(
        name="rdzv_rank_0_leaves_before_the_reads",
        file=RDZV,
        why="rank 0 raises before the others have read: a slow reader gets the store's error",
        old='        wait_until(deadline, lambda: store.check([f"read/{r}" for r in sizes]))\n',
        new="        pass\n",
        caught_by="mismatched_world_sizes",
        says=("rank 0 raised before rank 1 read",),
    ),
    dict(
        name="rdzv_group_without_timeout",
        file=RDZV,
        why="init_process_group without timeout=: a collective after a good join waits 30 min",
        old="world_size=world_size, timeout=limit)",
        new="world_size=world_size)",
        caught_by="collective_after_the_join_obeys_the_timeout",
        says=("without timeout=",),
    ),
    dict(
        name="rdzv_interface_not_checked",
        file=RDZV,
        why="no interface check: gloo's enforce failure, a traceback",
        old="    if problem := interface_problem(backend):\n",
        new="    if problem := None:\n",
        caught_by="missing_interface",
    ),
    # --- starved.py ---
    dict(
        name="starved_no_workers",
        file=STARVED,
        why="the bug itself: every batch read by the training process",
        old="    ahead = dict(persistent_workers=True, prefetch_factor=4) if workers else {}\n",
        new="    return DataLoader(dataset, batch_size, sampler=sampler)\n",
        caught_by="cut_the_data_wait",
    ),
    dict(
        name="starved_one_worker",
        file=STARVED,
        why="one worker whatever `workers` says: it reads as slowly as the loop did",
        old="sampler=sampler, num_workers=workers,",
        new="sampler=sampler, num_workers=min(workers, 1),",
        caught_by="cut_the_data_wait",
    ),
    dict(
        name="starved_shuffle_of_its_own",
        file=STARVED,
        why="shuffle=True instead of the sampler: other batches than the sampler's",
        old="dataset, batch_size, sampler=sampler, num_workers=workers,",
        new="dataset, batch_size, shuffle=True, num_workers=workers,",
        caught_by="not_which",
    ),
    # --- silent.py ---
    dict(
        name="silent_epoch_never_set",
        file=SILENT,
        why="the bug itself: set_epoch never called, every epoch in one order",
        old="    sampler.set_epoch(epoch)\n",
        new="    pass\n",
        caught_by="shuffled_anew",
    ),
    dict(
        name="silent_epoch_plus_rank",
        file=SILENT,
        why="set_epoch(epoch + rank): the ranks shuffle differently, their shards overlap",
        old="    sampler.set_epoch(epoch)\n",
        new="    sampler.set_epoch(epoch + dist.get_rank())\n",
        caught_by="shuffled_anew",
    ),
    dict(
        name="silent_every_rank_saves",
        file=SILENT,
        why="the rank check dropped: every rank writes the file",
        old="    if dist.get_rank() == 0:\n",
        new="    if True:\n",
        caught_by="alone_saves",
    ),
    dict(
        name="silent_module_prefix_saved",
        file=SILENT,
        why="DDP's own state_dict saved: every key starts with 'module.'",
        old="        torch.save(model.module.state_dict(), path)\n",
        new="        torch.save(model.state_dict(), path)\n",
        caught_by="alone_saves",
    ),
    dict(
        name="silent_accuracy_of_rank_0",
        file=SILENT,
        why="the bug itself: this rank's share only",
        old="    dist.all_reduce(counts)\n",
        new="",
        caught_by="counts_every_rank",
    ),
    dict(
        name="silent_mean_of_accuracies",
        file=SILENT,
        why="the ranks' accuracies averaged: wrong when their shares differ in size",
        old="    counts = torch.tensor([correct, total], dtype=torch.float64)\n"
        "    dist.all_reduce(counts)\n    return (counts[0] / counts[1]).item()\n",
        new="    mine = torch.tensor([correct / total], dtype=torch.float64)\n"
        "    dist.all_reduce(mine)\n    return mine.item() / dist.get_world_size()\n",
        caught_by="counts_every_rank",
    ),
    dict(
        name="silent_same_augmentation_seed",
        file=SILENT,
        why="the bug itself: one seed on every rank",
        old="    return torch.Generator().manual_seed(seed + 1000 * dist.get_rank())\n",
        new="    return torch.Generator().manual_seed(seed)\n",
        caught_by="augmentation",
    ),
    dict(
        name="silent_loss_divided_by_world",
        file=SILENT,
        why="the bug itself: the loss divided by the world size, on top of DDP's average",
        old="    loss = F.cross_entropy(model(images), labels)\n    ### END BUG\n",
        new="    loss = F.cross_entropy(model(images), labels) / dist.get_world_size()\n",
        caught_by="global_batch",
    ),
    # Not a TODO: the scripts' flags the grading runs away from their defaults.
    dict(
        name="unused_nproc_ignored",
        file=UNUSED,
        why="--nproc read but not used: always 2 ranks",
        old="    mp.spawn(run, args=(args.nproc, ranks.free_port(), args), nprocs=args.nproc)\n",
        new="    mp.spawn(run, args=(2, ranks.free_port(), args), nprocs=2)\n",
        caught_by="unused_script",
    ),
    dict(
        name="unused_batch_size_ignored",
        file=UNUSED,
        why="--batch-size read but not used: always 32 images a rank",
        old="train(rank, world, args.steps, args.batch_size)",
        new="train(rank, world, args.steps, 32)",
        caught_by="unused_script",
    ),
    dict(
        name="hang_nproc_ignored",
        file=HANG,
        why="--nproc read but not used: always 3 ranks",
        old="ranks.spawn_gloo(worker, args.nproc, args.timeout, keep)",
        new="ranks.spawn_gloo(worker, 3, args.timeout, keep)",
        caught_by="hang_script",
    ),
    dict(
        name="hang_diagnose_flag_ignored",
        file=HANG,
        why="--diagnose read but DETAIL never turned on: no fingerprints to diagnose from",
        old='    keep = "message" if args.diagnose else "flight" if args.flight_recorder else None',
        new='    keep = "flight" if args.flight_recorder else None',
        caught_by="diagnose_flag",
    ),
    dict(
        name="hang_flight_recorder_flag_ignored",
        file=HANG,
        why="--flight-recorder read but nothing kept: the hang fails the job as before",
        old='    keep = "message" if args.diagnose else "flight" if args.flight_recorder else None',
        new='    keep = "message" if args.diagnose else None',
        caught_by="flight_recorder_flag",
    ),
    dict(
        name="rendezvous_give_up_ignored",
        file=RDZV,
        why="--give-up read but not used: the safety net fires after a fixed 60 s",
        old="faulthandler.dump_traceback_later(args.give_up, exit=True)",
        new="faulthandler.dump_traceback_later(60, exit=True)",
        caught_by="safety_net",
    ),
    dict(
        name="silent_folder_ignored",
        file=SILENT,
        why="--folder read but not used: the weights go to a temporary folder",
        old="args.folder or scratch), nprocs=2)",
        new="scratch), nprocs=2)",
        caught_by="saves_in_its_folder",
    ),
]

ALTERNATIVES = [
    dict(
        name="accumulate_by_share_and_other_honest_fixes",
        why="oom: each micro-batch's mean loss weighted by its share of the batch; unused: the "
        "head used in forward instead of removed; hang: DistributedSampler's padded shards; "
        "flight recorder: the rank behind found first, by sequence number; "
        "rendezvous: rank 0 tries the port itself and exits with sys.exit, store.wait with a "
        "timeout, the mismatch said size first; starved: DataLoader's defaults besides the workers; silent: sampler.epoch "
        "set directly, seed + rank, the counts gathered with all_gather",
        old='reduction="sum") / len(labels)\n',
        new=") * (len(y) / len(labels))\n",
        also=[
            dict(
                file=UNUSED,
                old="        ### FIX\n        ### END BUG\n",
                new="        self.aux = nn.Linear(10, classes)  # on top of the first head\n",
            ),
            dict(
                file=UNUSED,
                old="        return self.body(x)\n",
                new="        return self.aux(self.body(x))\n",
            ),
            dict(
                file=HANG, old="    dist.all_reduce(steps, op=dist.ReduceOp.MIN)", new="    pass  #"
            ),
            dict(  # the flight recorder read another way: furthest sequence first, then ops
                file=HANG,
                old="    common, _ = Counter(last.values()).most_common(1)[0]  # what most ranks "
                "are stuck in\n",
                new="    furthest = max(seq for seq, _ in last.values())\n"
                "    behind = [r for r, (seq, _) in last.items() if seq < furthest]\n"
                "    ops = sorted(op for seq, op in last.values() if seq == furthest)\n"
                "    common = (furthest, max(set(ops), key=ops.count))\n"
                "    if behind:\n"
                "        return behind[0], common[1].partition(':')[2] or common[1]\n",
            ),
            dict(
                file=HANG,
                old="    steps = torch.tensor([len(labels) // batch_size])\n",
                new="    images, labels = data.digits()[0].tensors\n"
                "    from torch.utils.data import DistributedSampler\n"
                "    index = list(DistributedSampler(range(len(labels)), shuffle=False))\n"
                "    images, labels = images[index], labels[index]\n"
                "    steps = -(-len(labels) // batch_size)\n",
            ),
            dict(
                file=RDZV,
                old="    try:\n        store = dist.TCPStore(",
                new="    if rank == 0:  # is the port free? take it for a moment\n"
                "        probe = socket.socket()\n"
                "        try:\n"
                '            probe.bind(("", port))\n'
                "        except OSError:\n"
                '            sys.exit(f"rendezvous: MASTER_PORT {port} is in use here")\n'
                "        finally:\n"
                "            probe.close()\n"
                "    try:\n        store = dist.TCPStore(",
            ),
            dict(
                file=RDZV,
                old="    if not wait_until(deadline, lambda: store.check(keys)):\n"
                "        raise ConnectionError(\n",
                new="    try:\n"
                "        left = timedelta(seconds=max(deadline - time.monotonic(), 0.1))\n"
                "        store.wait(keys, left)\n"
                "    except dist.DistStoreError:\n"
                "        raise ConnectionError(\n",
            ),
            dict(
                file=RDZV,
                old="        )\n    sizes = {",
                new="        ) from None\n    sizes = {",
            ),
            dict(  # the mismatch said size first, the group's timeout written inline
                file=RDZV,
                old='                f"rank {other} was started with WORLD_SIZE={size}, rank {rank} with "\n'
                '                f"WORLD_SIZE={world_size}: start every rank with the same one"\n',
                new='                f"WORLD_SIZE={size} on rank {other} but WORLD_SIZE={world_size} on "\n'
                '                f"rank {rank}"\n',
            ),
            dict(
                file=RDZV,
                old="world_size=world_size, timeout=limit)",
                new="world_size=world_size,\n"
                "                            timeout=timedelta(seconds=timeout))",
            ),
            dict(
                file=STARVED,
                old="    ahead = dict(persistent_workers=True, prefetch_factor=4) if",
                new="    ahead = {}  # DataLoader's defaults\n    _ = 0 if",
            ),
            dict(file=SILENT, old="sampler.set_epoch(epoch)\n", new="sampler.epoch = epoch\n"),
            dict(
                file=SILENT,
                old="return torch.Generator().manual_seed(seed + 1000 * dist",
                new="return torch.Generator().manual_seed(seed + 1 * dist",
            ),
            dict(
                file=SILENT,
                old="    dist.all_reduce(counts)\n    return (counts[0] / counts[1]).item()\n",
                new="    every = [counts.clone() for _ in range(dist.get_world_size())]\n"
                "    dist.all_gather(every, counts)\n"
                "    return (sum(every)[0] / sum(every)[1]).item()\n",
            ),
        ],  # fmt: skip
    ),
]
