"""Realistic wrong versions of lesson 11 (pipeline.py: the pipeline steps, GPipe, 1F1B and
PyTorch's schedules), and an honest different version.

Format: see lesson_03.py.
"""

FILE = "11_model_parallel/pipeline.py"

MUTANTS = [
    dict(
        name="loss_not_divided",
        why="each micro-batch's mean loss back-propagated whole: the gradients are the sum "
        "over micro-batches, 4 times the whole batch's",
        old="        y = F.cross_entropy(y.flatten(0, 1), targets.flatten()) / micro_batches\n",
        new="        y = F.cross_entropy(y.flatten(0, 1), targets.flatten())\n",
        caught_by="computes_what_the_whole_model",
    ),
    dict(
        name="received_activation_without_grad",
        why="the received activation does not require a gradient: backward stops at the "
        "stage's input, and earlier stages never learn",
        old="    x = tokens if pipe.first else pipe.recv_forward().requires_grad_()\n",
        new="    x = tokens if pipe.first else pipe.recv_forward()\n",
        also=[
            dict(
                old="    if not pipe.first:\n        pipe.send_backward(x.grad)\n",
                new="    if not pipe.first:\n"
                "        pipe.send_backward(torch.zeros(pipe.shape) if x.grad is None else x.grad)\n",
            )
        ],
        caught_by="computes_what_the_whole_model",
    ),
    dict(
        name="loss_end_confused",
        why="backward from the loss on the first stage instead of the last: the first "
        "stage's output is no loss but an activation, and its gradient comes from the next",
        old="    y.backward() if pipe.last else y.backward(pipe.recv_backward())\n",
        new="    y.backward() if pipe.first else y.backward(pipe.recv_backward())\n",
        caught_by="computes_what_the_whole_model",
    ),
    dict(
        name="one_micro_batch_at_a_time",
        why="each micro-batch forward and backward through every stage before the next: "
        "no two stages ever work at once",
        old="    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()\n",
        new="    warmup, saved = 0, deque()\n",
        caught_by="bubble_is_what_theory",
    ),
    dict(
        name="gpipe_called_1f1b",
        why="every forward first, then every backward: GPipe's memory under 1F1B's name",
        old="    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()\n",
        new="    warmup, saved = m, deque()\n",
        caught_by="1f1b_only_the_stages_after",
    ),
    dict(
        name="same_warmup_on_every_stage",
        why="every stage warms up with stages - 1 forwards, not only the first: later "
        "stages keep more activations than they need",
        old="    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()\n",
        new="    warmup, saved = min(pipe.world - 1, m), deque()\n",
        caught_by="1f1b_only_the_stages_after",
    ),
    dict(
        name="gpipe_interleaved",
        why="GPipe's backward run right after each forward: sequential micro-batches",
        old="""    saved = [forward_step(pipe, inputs[i], targets[i], len(inputs)) for i in range(len(inputs))]
    for x, y in saved:
        backward_step(pipe, x, y)
""",
        new="""    for i in range(len(inputs)):
        backward_step(pipe, *forward_step(pipe, inputs[i], targets[i], len(inputs)))
""",
        caught_by="gpipe_keeps_every_micro_batch",
    ),
    dict(
        name="torch_schedule_always_gpipe",
        why="ScheduleGPipe built whatever the name: --schedule torch-1f1b is GPipe",
        old='    schedule = ScheduleGPipe if name == "torch-gpipe" else Schedule1F1B\n',
        new="    schedule = ScheduleGPipe\n",
        caught_by="torch_pipelining_computes_the_same",
    ),
]

ALTERNATIVES = [
    dict(
        name="reversed_backwards_and_a_counted_1f1b",
        why="GPipe's backwards from the last micro-batch to the first (each stage in the "
        "same order, so the messages still match); 1F1B as one loop over the step's "
        "actions, counting forwards and backwards done; the stage's input asked for with "
        "torch.Tensor.requires_grad, and the loss averaged after the cross-entropy sum",
        old="""    saved = [forward_step(pipe, inputs[i], targets[i], len(inputs)) for i in range(len(inputs))]
    for x, y in saved:
        backward_step(pipe, x, y)
""",
        new="""    saved = []
    for tokens, target in zip(inputs, targets, strict=True):
        saved.append(forward_step(pipe, tokens, target, len(inputs)))
    while saved:
        backward_step(pipe, *saved.pop())
""",
        also=[
            dict(
                old="""    warmup, saved = min(pipe.world - pipe.rank - 1, m), deque()
    for i in range(warmup):
        saved.append(forward_step(pipe, inputs[i], targets[i], m))
    for i in range(warmup, m):
        saved.append(forward_step(pipe, inputs[i], targets[i], m))
        backward_step(pipe, *saved.popleft())
    while saved:
        backward_step(pipe, *saved.popleft())
""",
                new="""    ahead = pipe.world - pipe.rank  # micro-batches in flight on this stage, at most
    saved, done_f, done_b = [], 0, 0
    while done_b < m:
        if done_f < m and done_f - done_b < ahead:
            saved.append(forward_step(pipe, inputs[done_f], targets[done_f], m))
            done_f += 1
        else:
            backward_step(pipe, *saved.pop(0))
            done_b += 1
""",
            ),
            dict(
                old="""    x = tokens if pipe.first else pipe.recv_forward().requires_grad_()
    y = pipe.stage(x)
    if pipe.last:
        y = F.cross_entropy(y.flatten(0, 1), targets.flatten()) / micro_batches
""",
                new="""    if pipe.first:
        x = tokens
    else:
        x = pipe.recv_forward()
        x.requires_grad = True
    y = pipe.stage(x)
    if pipe.last:
        total = F.cross_entropy(y.flatten(0, 1), targets.flatten(), reduction="sum")
        y = total / (targets.numel() * micro_batches)
""",
            ),
        ],
    ),
]
