"""Realistic wrong versions of lesson 14 (compose.py: the mesh, the pipeline cut, the order
and axes of TP and FSDP, the pipeline stage), and an honest different version.

Format: see lesson_03.py.
"""

FILE = "14_composing/compose.py"

MUTANTS = [
    dict(
        name="mesh_axes_reversed",
        why="the mesh built (tp, dp, pp): tp groups 4 ranks apart, which on GPUs are other "
        "machines; the numbers are still right",
        old='    return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", '
        '"tp"))\n',
        new='    return init_device_mesh(device_type, (tp, dp, pp), mesh_dim_names=("tp", "dp", '
        '"pp"))\n',
        caught_by="mesh_groups_are",
        says=["Likely cause: the mesh's axes in another order"],
    ),
    dict(
        name="stages_cut_unevenly",
        why="one block too many per stage: the first stage runs 3 blocks, the last 1, while "
        "the docstring says even; the numbers are still right",
        old="    per = len(model.blocks) // stages\n",
        new="    per = len(model.blocks) // stages + 1\n",
        caught_by="even_cut",
    ),
    dict(
        name="fsdp_before_tp",
        why="fully_shard first, then parallelize_module: TP meets FSDP's DTensors",
        old='        parallelize_module(block, mesh["tp"], plan)\n'
        '        fully_shard(block, mesh=mesh["dp"])\n',
        new='        fully_shard(block, mesh=mesh["dp"])\n'
        '        parallelize_module(block, mesh["tp"], plan)\n',
        caught_by="step_one",
    ),
    dict(
        name="root_averaged_over_tp",
        why="the root (embedding, norm, head) sharded over the tp axis: its gradients are "
        "averaged over ranks that saw the same data, never over the dp ranks",
        old='    fully_shard(model, mesh=mesh["dp"])\n',
        new='    fully_shard(model, mesh=mesh["tp"])\n',
        caught_by="step_one",
        says=["gradients averaged over the wrong group"],
    ),
    dict(
        name="stage_index_from_global_rank",
        why="the stage's index taken from the global rank: ranks 2-7 name stages that do not exist",
        old="    stage = PipelineStage(model, pp.get_local_rank(), pp.size(), device, "
        "group=pp.get_group())\n",
        new="    stage = PipelineStage(model, dist.get_rank(), pp.size(), device, "
        "group=pp.get_group())\n",
        caught_by="step_one",
    ),
]

MUTANTS += [
    dict(
        name="whole_stage_one_fsdp_unit",
        why="the whole stage one FSDP unit: all its weights gathered at once, held through "
        "backward",
        old='        fully_shard(block, mesh=mesh["dp"])\n',
        new="",
        caught_by="moves_what_its_axis_owes",
        says=("the whole stage sharded as one unit",),
    ),
    dict(
        name="schedule_given_the_stage_count",
        why="the schedule given pp.size() micro-batches instead of its argument",
        old="Schedule1F1B(stage, micro_batches, loss_fn=loss_fn)",
        new="Schedule1F1B(stage, pp.size(), loss_fn=loss_fn)",
        caught_by="moves_what_its_axis_owes",
    ),
    dict(
        name="no_tensor_parallelism",
        why="the tp axis skipped: every tp rank holds whole MLP weights and does the same work",
        old='        parallelize_module(block, mesh["tp"], plan)\n',
        new="",
        caught_by="follows_the_1d_fsdp_control",
        says=("an axis skipped",),
    ),
    dict(
        name="norm_left_on_the_first_stage",
        why="the final norm left on stage 0: unused there, and the grader's load crashes",
        old="        model.norm = model.head = None\n",
        new="        model.head = None\n",
        caught_by="holds_an_even_cut",
        says=("the final norm kept",),
    ),
]

ALTERNATIVES = [
    dict(
        name="mesh_by_hand_one_plan_gpipe",
        why="the mesh built from an explicit grid of ranks (DeviceMesh); the stage kept by "
        "chunking the block indices, parts dropped with setattr; every block split by one "
        "parallelize_module call with wildcards before any fully_shard, which keeps "
        "weights gathered between forward and backward (TorchTitan's choice under a "
        "pipeline); a GPipe schedule, the stage placed by mesh.get_local_rank('pp')",
        old='    return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", '
        '"tp"))\n',
        new="    from torch.distributed.device_mesh import DeviceMesh\n\n"
        "    grid = torch.arange(pp * dp * tp).view(pp, dp, tp)\n"
        '    return DeviceMesh(device_type, grid, mesh_dim_names=("pp", "dp", "tp"))\n',
        also=[
            dict(
                old="    per = len(model.blocks) // stages\n"
                "    for key in list(model.blocks):\n"
                "        if not stage * per <= int(key) < (stage + 1) * per:\n"
                "            del model.blocks[key]\n"
                "    if stage > 0:\n"
                "        model.embed = None\n"
                "    if stage < stages - 1:\n"
                "        model.norm = model.head = None\n",
                new="    mine = {str(i) for i in torch.arange(len(model.blocks)).chunk(stages)"
                "[stage].tolist()}\n"
                "    for key in [k for k in model.blocks if k not in mine]:\n"
                "        model.blocks.pop(key)\n"
                '    for name, keep in (("embed", stage == 0), ("norm", stage == stages - 1),\n'
                '                       ("head", stage == stages - 1)):\n'
                "        if not keep:\n"
                "            setattr(model, name, None)\n",
            ),
            dict(
                old='    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}\n'
                "    for block in model.blocks.values():\n"
                '        parallelize_module(block, mesh["tp"], plan)\n'
                '        fully_shard(block, mesh=mesh["dp"])\n'
                '    fully_shard(model, mesh=mesh["dp"])\n',
                new='    plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": '
                "RowwiseParallel()}\n"
                '    parallelize_module(model, mesh["tp"], plan)\n'
                "    for block in model.blocks.values():\n"
                '        fully_shard(block, mesh=mesh["dp"], reshard_after_forward=False)\n'
                '    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)\n',
            ),
            dict(
                old='    pp = mesh["pp"]\n'
                "    stage = PipelineStage(model, pp.get_local_rank(), pp.size(), device, "
                "group=pp.get_group())\n"
                "    return Schedule1F1B(stage, micro_batches, loss_fn=loss_fn)\n",
                new="    from torch.distributed.pipelining import ScheduleGPipe\n\n"
                '    index, count = mesh.get_local_rank("pp"), mesh.size(0)\n'
                '    stage = PipelineStage(model, index, count, device, group=mesh.get_group("pp"))\n'
                "    return ScheduleGPipe(stage, n_microbatches=micro_batches, loss_fn=loss_fn)\n",
            ),
        ],
    ),
]
