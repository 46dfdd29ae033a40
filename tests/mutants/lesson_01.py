"""Realistic wrong versions of lesson 01 (one device), and an honest different one.

See tests/mutants/lesson_03.py for the format; tests/mutants/test_mutants.py applies them.
"""

FILE = "01_single_device/train.py"

MUTANTS = [
    dict(
        name="gradients_never_cleared",
        why="no optimizer.zero_grad(): every step adds to all the gradients before it",
        old="        optimizer.zero_grad(set_to_none=True)\n        loss.backward()\n",
        new="        loss.backward()\n",
        caught_by="learns_digits or optimizer_steps",
    ),
    dict(
        name="loss_summed_over_the_batch",
        why="reduction='sum' in training: the step is batch-size times too large",
        old="            loss = F.cross_entropy(model(images), labels)\n",
        new='            loss = F.cross_entropy(model(images), labels, reduction="sum")\n',
        caught_by="graders_own",
    ),
    dict(
        name="mean_of_batch_means",
        why="evaluate sums batch means: the last, smaller batch weighs as much as a full one",
        old='total_loss += F.cross_entropy(logits, labels, reduction="sum").item()',
        new="total_loss += F.cross_entropy(logits, labels).item() * 3",
        caught_by="evaluate_counts",
    ),
    dict(
        name="no_model_eval",
        why="evaluate leaves the model in training mode (BatchNorm uses batch statistics)",
        old="    model.eval()  # BatchNorm uses its running statistics",
        new="    pass  # BatchNorm uses its running statistics",
        caught_by="evaluate_counts",
    ),
    dict(
        name="epoch_in_progress_saved",
        why="the checkpoint says `epoch` (the one in progress) instead of epoch + 1 (done)",
        old="save(checkpoint_state(model, optimizer, epoch + 1, step), args.checkpoint)",
        new="save(checkpoint_state(model, optimizer, epoch, step), args.checkpoint)",
        caught_by="checkpoint_is_complete or resume_is_bit_exact",
    ),
    dict(
        name="optimizer_not_saved",
        why="checkpoint_state keeps the weights only: the resumed run loses SGD's momentum",
        old='        "optimizer": optimizer.state_dict(),\n',
        new='        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1).state_dict(),\n',
        caught_by="round_trip or resume_is_bit_exact or checkpoint_is_complete",
    ),
    dict(
        name="rng_not_restored",
        why="restore() forgets the random generators: the resumed epoch shuffles differently",
        old='    set_rng_state(state["rng"])\n',
        new="",
        caught_by="round_trip or resume_is_bit_exact",
    ),
    dict(
        name="momentum_not_restored",
        why="restore() forgets the optimizer: SGD restarts without its momentum",
        old='    optimizer.load_state_dict(state["optimizer"])\n',
        new="",
        caught_by="round_trip or resume_is_bit_exact",
    ),
    # Not TODOs, but what a student who rewrites the loop can get wrong (issue: three
    # classes the budget cuts had let pass): a metric from another split, a checkpoint
    # written over the last one.
    dict(
        name="epoch_metrics_from_the_training_split",
        why="each epoch's test_loss and test_accuracy are evaluated on the training images",
        old="        test_loss, accuracy = evaluate(model, test_loader, device)\n",
        new="        test_loss, accuracy = evaluate(model, train_loader, device)\n",
        caught_by="metrics_json_shape",
        says=("other numbers than the test split's",),
    ),
    dict(
        name="checkpoint_written_in_place",
        why="torch.save straight onto --checkpoint: a crash mid-write destroys the last epoch",
        old="            save(checkpoint_state(model, optimizer, epoch + 1, step), "
        "args.checkpoint)\n",
        new="            torch.save(checkpoint_state(model, optimizer, epoch + 1, step), "
        "args.checkpoint)\n",
        caught_by="written_atomically",
        says=("'over'",),
    ),
    dict(
        name="checkpoint_removed_then_written",
        why="the old checkpoint is deleted before the new one is written: a crash between "
        "the two leaves none",
        old="            save(checkpoint_state(model, optimizer, epoch + 1, step), "
        "args.checkpoint)\n",
        new="            import os\n"
        "            if os.path.exists(args.checkpoint):\n"
        "                os.remove(args.checkpoint)\n"
        "            save(checkpoint_state(model, optimizer, epoch + 1, step), "
        "args.checkpoint)\n",
        caught_by="written_atomically",
        says=("'removed'",),
    ),
    # Not a TODO: flags the grading runs away from their defaults, whose effect it must see.
    dict(
        name="seed_ignored",
        why="--seed read but not used: every run starts from seed 0's weights",
        old="    seed_everything(args.seed)\n",
        new="    seed_everything(0)\n",
        caught_by="graders_own",
    ),
    dict(
        name="lr_ignored",
        why="--lr read but not used: the optimizer keeps the default 0.05",
        old="lr=args.lr, momentum=0.9",
        new="lr=0.05, momentum=0.9",
        caught_by="graders_own",
    ),
    dict(
        name="model_ignored",
        why="--model read but not used: the CNN trains whatever it names",
        old="    model = models.build_model(args.model, classes, channels, args.norm)\n",
        new='    model = models.build_model("cnn", classes, channels, args.norm)\n',
        caught_by="model_flag",
    ),
]

ALTERNATIVES = [
    dict(
        name="plain_step_and_mean_loss",
        why="a training step without autocast's context, and evaluate from mean losses x sizes",
        old='total_loss += F.cross_entropy(logits, labels, reduction="sum").item()',
        new="total_loss += F.cross_entropy(logits, labels).item() * len(labels)",
    ),
    dict(
        name="checkpoint_replaced_by_hand",
        why="the checkpoint written to a temporary file by torch.save, then os.replace'd "
        "onto the name, without course.checkpoint",
        old="            save(checkpoint_state(model, optimizer, epoch + 1, step), "
        "args.checkpoint)\n",
        new="            import os\n"
        "            torch.save(checkpoint_state(model, optimizer, epoch + 1, step), "
        "args.checkpoint + '.part')\n"
        "            os.replace(args.checkpoint + '.part', args.checkpoint)\n",
    ),
]
