"""Realistic wrong versions of lesson 05 (the ring all-reduce), and an honest different one.

Each entry rewrites the reference solution: `old` must appear exactly once in
solutions/05_collectives/collectives.py and becomes `new`. A mutant must be rejected
by the tests whose names contain `caught_by` (and its report contain the words in
`says`, if given); an alternative must pass every test of the lesson.
tests/mutants/test_mutants.py applies them.
"""

FILE = "05_collectives/collectives.py"

MUTANTS = [
    dict(
        name="blocking_send_first",
        why="every rank sends with a blocking dist.send before it receives: they all wait "
        "for each other forever (the classic ring deadlock)",
        old="        request = dist.isend(send, right) if send.numel() else None\n",
        new="        request = dist.send(send, right) if send.numel() else None\n",
        caught_by="sums_over_every_rank",
        # The report names the hang and its fix (the process-group timeout fires before
        # any deadline kills the run): tests/mutants/test_mutants.py checks these words.
        says=("ring did not finish", "dist.isend"),
    ),
    dict(
        name="received_chunk_overwrites",
        why="the reduce-scatter stores what it receives instead of adding it",
        old="        into += received\n",
        new="        into.copy_(received)\n",
        caught_by="sums_over_every_rank",
    ),
    dict(
        name="all_gather_passes_the_wrong_chunk",
        why="the all-gather passes on the chunk it just received one step late",
        old="exchange(chunks[(rank + 1 - step) % world], chunks[(rank - step) % world])",
        new="exchange(chunks[(rank - step) % world], chunks[(rank - step - 1) % world])",
        caught_by="sums_over_every_rank",
    ),
    dict(
        name="one_step_too_few",
        why="each phase stops after world - 2 steps: with 2 ranks nothing is exchanged",
        old="    for step in range(world - 1):  # reduce-scatter\n",
        new="    for step in range(world - 2):  # reduce-scatter\n",
        caught_by="sums_over_every_rank",
    ),
    dict(
        name="library_all_reduce",
        why="the exercise skipped: dist.all_reduce inside ring_all_reduce, right sums",
        old="    for step in range(world - 1):  # reduce-scatter\n",
        new=(
            "    dist.all_reduce(tensor)\n    return tensor\n"
            "    for step in range(world - 1):  # reduce-scatter\n"
        ),
        caught_by="sums_over_every_rank",
        says=("called dist.all_reduce inside ring_all_reduce",),
    ),
    dict(
        name="every_rank_to_every_rank",
        why="no ring: each rank sends its whole tensor to every other and adds what comes",
        old="    for step in range(world - 1):  # reduce-scatter\n",
        new="""    requests = [dist.isend(tensor, peer) for peer in range(world) if peer != rank]
    total = tensor.clone()
    for peer in range(world):
        if peer != rank:
            received = torch.empty_like(tensor)
            dist.recv(received, peer)
            total += received
    for request in requests:
        request.wait()
    return tensor.copy_(total)
    for step in range(world - 1):  # reduce-scatter
""",
        caught_by="sums_over_every_rank",
        says=("around a ring, a rank sends to one neighbour",),
    ),
    dict(
        name="sends_the_wrong_chunk",
        why="the reduce-scatter sends chunk r - s + 1 where the neighbour expects r - s: "
        "with chunks of unequal length a message does not fit its receive buffer",
        old="        exchange(chunks[(rank - step) % world], received)\n",
        new="        exchange(chunks[(rank - step + 1) % world], received)\n",
        caught_by="sums_over_every_rank",
        says=("died of SIGABRT", "different sizes"),
    ),
]

ALTERNATIVES = [
    dict(
        name="irecv_and_isend_then_wait_both",
        why="both directions non-blocking, then wait for both (no helper function)",
        old="""        request = dist.isend(send, right) if send.numel() else None
        if recv.numel():
            dist.recv(recv, left)
        if request is not None:
            request.wait()
""",
        new="""        pending = []
        if recv.numel():
            pending.append(dist.irecv(recv, left))
        if send.numel():
            pending.append(dist.isend(send, right))
        for request in pending:
            request.wait()
""",
    ),
    dict(
        name="batch_isend_irecv",
        why="each step's send and receive as one batch of P2POps (torch's batched API)",
        old="""        request = dist.isend(send, right) if send.numel() else None
        if recv.numel():
            dist.recv(recv, left)
        if request is not None:
            request.wait()
""",
        new="""        ops = [dist.P2POp(dist.isend, send, right)] if send.numel() else []
        ops += [dist.P2POp(dist.irecv, recv, left)] if recv.numel() else []
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()
""",
    ),
]
