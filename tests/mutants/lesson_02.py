"""Realistic wrong versions of lesson 02 (DataParallel), and an honest different one.

See tests/mutants/lesson_03.py for the format; tests/mutants/test_mutants.py applies them.
"""

FILE = "02_data_parallel/train_dp.py"
UNWRAP = (
    "    if isinstance(model, nn.DataParallel):\n        return model.module\n    return model\n"
)

MUTANTS = [
    dict(
        name="data_parallel_on_one_gpu",
        why="DataParallel over a single GPU: only the cost of scatter and gather",
        old="    if len(device_ids) >= 2:\n        return nn.DataParallel(",
        new="    if len(device_ids) >= 1:\n        return nn.DataParallel(",
        caught_by="wraps_only",
    ),
    dict(
        name="unwrap_forgotten",
        why="unwrap returns the wrapper: checkpoints get 'module.' keys",
        old=UNWRAP,
        new="    return model\n",
        caught_by="unwrap or wrapped_model_loads",
    ),
]

ALTERNATIVES = [
    dict(
        name="unwrap_with_getattr",
        why="unwrap through getattr(model, 'module', model)",
        old=UNWRAP,
        new='    return getattr(model, "module", model)\n',
    ),
]
