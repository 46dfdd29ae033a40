"""Realistic wrong versions of lesson 15 (plan.py: the shards, the activations in flight,
the bytes on each axis, the step time, the questions), and an honest different version.

Format: see lesson_03.py.
"""

FILE = "15_planning/plan.py"

MUTANTS = [
    dict(
        name="last_but_one_stage_sends_one_way",
        why="a stage's messages counted with pp - 2: the last but one stage misses the messages "
        "it sends to the last, and a three-stage pipeline's middle looks faster than it is "
        "(found by the mutation engine)",
        old="        messages = ((stage > 0) + (stage < par.pp - 1)) * m if par.pp > 1 else 0\n",
        new="        messages = ((stage > 0) + (stage < par.pp - 2)) * m if par.pp > 1 else 0\n",
        caught_by="step_time",
    ),
    dict(
        name="best_tp_larger_on_a_tie",
        why="a shape replaces the best when its step is no longer, not only when shorter: on a "
        "tie the larger tp wins (found by the mutation engine)",
        old="            if best is None or total < best[0]:\n",
        new="            if best is None or total <= best[0]:\n",
        caught_by="questions",
        says=["the smaller tp on a tie"],
    ),
    dict(
        name="held_without_padding",
        why="the stage's bytes divided evenly by dp: right when every tensor's rows split, "
        "wrong for the vocabularies and widths that do not",
        old="        max(0, min(p, s[0] - dp_rank * p)) * math.prod(s[1:]) * FLOAT\n",
        new="        math.prod(s) * FLOAT / par.dp\n",
        caught_by="held_bytes",
        says=["divided evenly by dp"],
    ),
    dict(
        name="held_full_shard_on_every_rank",
        why="every rank given ceil(n / dp) rows: the last ranks hold fewer, or none",
        old="        max(0, min(p, s[0] - dp_rank * p)) * math.prod(s[1:]) * FLOAT\n",
        new="        p * math.prod(s[1:]) * FLOAT\n",
        caught_by="held_bytes",
    ),
    dict(
        name="one_micro_batch_in_flight",
        why="the activations of one micro-batch, as if each backward ran right after its "
        "forward: the pipeline keeps several in flight",
        old='    in_flight = m if par.schedule == "gpipe" else min(m, par.pp - stage)\n',
        new="    in_flight = 1\n",
        caught_by="activations",
        says=["in flight"],
    ),
    dict(
        name="gather_counted_as_reduce_scatter",
        why="the all-gather counted as the whole unit, like the reduce-scatter's input: a "
        "gather sends only the rank's shard",
        old='        out["dp.all_gather"], out["dp.reduce_scatter"] = padded, padded * par.dp\n',
        new='        out["dp.all_gather"] = out["dp.reduce_scatter"] = padded * par.dp\n',
        caught_by="traffic",
        says=["all-gather counted as"],
    ),
    dict(
        name="data_parallel_not_overlapped",
        why="every second of data-parallel traffic added to the step, none hidden behind compute",
        old='                      "exposed": max(0.0, dp - compute), "bubble": busy * (par.pp - 1) '
        "/ m,\n",
        new='                      "exposed": dp, "bubble": busy * (par.pp - 1) / m,\n',
        caught_by="step_time",
    ),
    dict(
        name="bubble_share_of_the_busy_time",
        why="the bubble's share taken as (pp - 1) / m, of the busy time, not of the step",
        old="    return max(1, math.ceil((pp - 1) * (1 - target) / target - 1e-9))\n",
        new="    return max(1, math.ceil((pp - 1) / target - 1e-9))\n",
        caught_by="questions",
    ),
]

MUTANTS += [
    dict(
        name="communication_bound_batch_fixed",
        why="the global batch kept as dp grows: each rank's share shrinks, and compute with "
        "it, so the bound comes far too early",
        old="        shape = Parallel(par.pp, dp, par.tp, per_rank * dp, par.micro_batches, "
        "par.schedule)\n",
        new="        shape = Parallel(par.pp, dp, par.tp, par.batch, par.micro_batches, "
        "par.schedule)\n",
        caught_by="questions",
    ),
    dict(
        name="best_tp_grows_the_world",
        why="dp kept as tp grows: each candidate runs on more GPUs than the question has",
        old="        dp = par.tp * par.dp // tp\n",
        new="        dp = par.dp\n",
        caught_by="questions",
    ),
]

# Shortcuts: the grader's own answers, reached from the submission. Each is refused at
# import in the child that runs it (course/grader/submission.py), naming the shortcut.
MUTANTS += [
    dict(
        name="imports_the_graders_model",
        why="held() answered by the grader's own cost model, found beside the tests",
        old="    ### BEGIN SOLUTION\n    per = [math.ceil(s[0] / par.dp)",
        new="    ### BEGIN SOLUTION\n"
        "    import sys\n"
        "    from pathlib import Path\n\n"
        "    import course\n\n"
        "    sys.path.insert(0, str(Path(course.__file__).parents[1] / 'tests' / 'lessons' / 'cases'))\n"
        "    import lesson_15_models as grader\n\n"
        "    from course.measure.scale import Config\n\n"
        "    c = Config(par.pp, par.dp, par.tp, model.depth, model.dim, model.vocab, model.seq, "
        "par.batch, par.micro_batches, par.schedule, model.hidden)\n"
        "    return grader.held(c, stage, dp_rank)\n"
        "    per = [math.ceil(s[0] / par.dp)",
        caught_by="held_bytes",
        says=["is the grader's own code"],
    ),
    dict(
        name="counts_on_the_graders_fake_world",
        why="traffic() measured by the grader's counting code on a fake world of that size",
        old="    ### BEGIN SOLUTION\n    m = par.micro_batches\n",
        new="    ### BEGIN SOLUTION\n"
        "    from course.measure import scale\n\n"
        "    del scale\n"
        "    m = par.micro_batches\n",
        caught_by="activations",
        says=["course.measure.scale is the grader's own code"],
    ),
]

ALTERNATIVES = [
    dict(
        name="loops_and_tables",
        why="the shards counted tensor by tensor in a loop, with divmod; the in-flight "
        "micro-batches from a table by schedule; the questions by plain search",
        old="    per = [math.ceil(s[0] / par.dp) for unit in units(model, par, stage) for s in unit]\n"
        "    shapes = [s for unit in units(model, par, stage) for s in unit]\n"
        "    shards = sum(\n"
        "        max(0, min(p, s[0] - dp_rank * p)) * math.prod(s[1:]) * FLOAT\n"
        "        for p, s in zip(per, shapes, strict=True)\n"
        "    )\n",
        new="    shards = 0\n"
        "    for unit in units(model, par, stage):\n"
        "        for shape in unit:\n"
        "            chunk = -(-shape[0] // par.dp)\n"
        "            start = dp_rank * chunk\n"
        "            mine = len(range(start, min(start + chunk, shape[0])))\n"
        "            shards += mine * math.prod(shape[1:]) * FLOAT\n",
        also=[
            dict(
                old='    in_flight = m if par.schedule == "gpipe" else min(m, par.pp - stage)\n',
                new='    in_flight = {"gpipe": m, "1f1b": min(m, par.pp - stage)}[par.schedule]\n',
            ),
            dict(
                old="    return max(1, math.ceil((pp - 1) * (1 - target) / target - 1e-9))\n",
                new="    m = 1\n"
                "    while (pp - 1) / (m + pp - 1) > target:\n"
                "        m += 1\n"
                "    return m\n",
            ),
        ],
    ),
]
