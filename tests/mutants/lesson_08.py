"""Realistic wrong versions of lesson 08 (performance), and honest different ones.

Each entry rewrites the reference solution: `old` must appear exactly once in
solutions/08_performance/train.py and becomes `new`. A mutant must be rejected by the
tests whose names contain `caught_by`; an alternative must pass every test of the
lesson. tests/mutants/test_mutants.py applies them.
"""

FILE = "08_performance/train.py"

_SYNCED = "        with contextlib.nullcontext() if last else model.no_sync():\n"
_BACKWARD = "            scaler.scale(loss / args.accumulate).backward()\n"
_OPTIONS = "                bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=not args.no_bucket_view,\n"
_COMPILE = (
    "    if args.compile:  # compile the wrapped model: graphs split at bucket edges, overlap kept\n"
    "        model = torch.compile(model)\n"
)
_FORWARD = (
    "            with torch.autocast(device.type, dtype=half or torch.bfloat16, "
    "enabled=bool(half)):\n"
    "                loss = F.cross_entropy(model(images), labels)\n"
)

MUTANTS = [
    dict(
        name="no_no_sync",
        why="every micro-batch all-reduces: the gradient is right, the traffic is k times",
        old=_SYNCED,
        new="        with contextlib.nullcontext():\n",
        caught_by="train_one_epoch_all_reduces_once",
    ),
    dict(
        name="no_sync_around_backward_only",
        why="the forward runs outside no_sync(): DDP has already prepared to all-reduce",
        old=_SYNCED + _FORWARD,
        new=_FORWARD.replace("            ", "        ") + _SYNCED + "            pass\n",
        caught_by="train_one_epoch_all_reduces_once",
    ),
    dict(
        name="never_synchronised",
        why="every micro-batch, the last one too, runs inside no_sync(): no rank averages",
        old=_SYNCED,
        new="        with model.no_sync():\n",
        caught_by="train_one_epoch_all_reduces_once",
    ),
    dict(
        name="loss_not_divided",
        why="the k micro-batch losses are summed: the step's gradient is k times too large",
        old=_BACKWARD,
        new="            scaler.scale(loss).backward()\n",
        caught_by="train_one_epoch_accumulates",
    ),
    dict(
        name="cleared_every_micro_batch",
        why="zero_grad runs before every backward: only the last micro-batch counts",
        old=_SYNCED,
        new="        optimizer.zero_grad(set_to_none=True)\n" + _SYNCED,
        caught_by="train_one_epoch_accumulates",
    ),
    dict(
        name="steps_every_micro_batch",
        why="the optimizer steps after every micro-batch, with partial gradients",
        old="        if last:\n            scaler.step(optimizer)",
        new="        if True:\n            scaler.step(optimizer)",
        caught_by="train_one_epoch_accumulates",
    ),
    dict(
        name="short_group_never_steps",
        why="the step only after a full group of accumulate micro-batches: the ones left at "
        "the epoch's end are all-reduced and never stepped (their gradient leaks into the "
        "next epoch's first step)",
        old="        if last:\n            scaler.step(optimizer)",
        new="        if (i + 1) % args.accumulate == 0:\n            scaler.step(optimizer)",
        caught_by="train_one_epoch_accumulates",
    ),
    # Not TODOs: a metric from another split, a checkpoint written over the last one.
    dict(
        name="epoch_metrics_from_the_training_split",
        why="rank 0 evaluates each epoch on the training loader and reports it as the test's",
        old="            test_loss, accuracy = evaluate(model.module, test_loader, device)\n",
        new="            test_loss, accuracy = evaluate(model.module, train_loader, device)\n",
        caught_by="fp16_run_learns",
        says=("other numbers than the test split's",),
    ),
    dict(
        name="checkpoint_written_in_place",
        why="torch.save straight onto --checkpoint: a crash mid-write destroys the last epoch",
        old="            save(state, args.checkpoint)\n",
        new="            torch.save(state, args.checkpoint)\n",
        caught_by="fp16_run_learns",
        says=("'over'",),
    ),
    dict(
        name="bucket_cap_ignored",
        why="--bucket-cap-mb never reaches DDP: every run uses 25 MB buckets",
        old=_OPTIONS,
        new=_OPTIONS.replace("bucket_cap_mb=args.bucket_cap_mb, ", ""),
        caught_by="bucket_options",
    ),
    dict(
        name="bucket_view_always_on",
        why="--no-bucket-view is ignored: gradient_as_bucket_view is always True",
        old=_OPTIONS,
        new=_OPTIONS.replace("not args.no_bucket_view", "True"),
        caught_by="bucket_options",
    ),
    dict(
        name="static_graph_ignored",
        why="--static-graph never reaches DDP: the benchmark measures nothing",
        old="                static_graph=args.static_graph, **NO_BUFFER_SYNC)  # fmt: skip\n",
        new="                **NO_BUFFER_SYNC)  # fmt: skip\n",
        caught_by="static_graph_from",
    ),
    dict(
        name="optimizer_steps_past_the_scaler",
        why="optimizer.step() instead of scaler.step(optimizer): fp16 steps with gradients "
        "65536 times too large",
        old="            scaler.step(optimizer)  # skips the step if a gradient overflowed",
        new="            optimizer.step()  # past the scaler",
        caught_by="fp16_run_learns",
    ),
    dict(
        name="scaler_never_updated",
        why="scaler.update() forgotten: GradScaler refuses a second step (and never lowers "
        "its scale after an overflow)",
        old="            scaler.update()\n",
        new="",
        caught_by="fp16_run_learns",
    ),
    dict(
        name="compile_ignored",
        why="--compile is parsed and never applied: the run is the same with or without it",
        old=_COMPILE,
        new="",
        caught_by="compile_flag_compiles_the_wrapped_model",
    ),
    dict(
        name="compile_always",
        why="torch.compile is applied whatever --compile says",
        old=_COMPILE,
        new=_COMPILE.replace("if args.compile:", "if True:"),
        caught_by="compile_flag_compiles_the_wrapped_model",
    ),
]

ALTERNATIVES = [
    dict(
        # Two honest rewrites in one submission (different lines of the TODO): one grading
        # of the whole lesson passes both.
        name="summed_loss_divided_gradients_and_exit_stack",
        why="the losses are summed and the gradients divided by k just before the step; "
        "no_sync entered through an ExitStack, the step counted by a modulo; and the "
        "checkpoint torch.save'd to a temporary file and os.replace'd onto its name",
        old=_BACKWARD
        + """        if last:
            scaler.step(optimizer)  # skips the step if a gradient overflowed (fp16)
""",
        new="""            scaler.scale(loss).backward()
        if last:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad /= args.accumulate
            scaler.step(optimizer)
""",
        also=[
            dict(
                old=_SYNCED,
                new="""        with contextlib.ExitStack() as stack:
            if (i + 1) % args.accumulate and i + 1 != len(loader):
                stack.enter_context(model.no_sync())
""",
            ),
            dict(
                old="            save(state, args.checkpoint)\n",
                new='            torch.save(state, f"{args.checkpoint}.{os.getpid()}.tmp")\n'
                '            os.replace(f"{args.checkpoint}.{os.getpid()}.tmp", args.checkpoint)\n',
            ),
        ],
    ),
]
