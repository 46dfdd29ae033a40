"""Realistic wrong versions of lesson 00 (environment check), and an honest different one.

See tests/mutants/lesson_03.py for the format; tests/mutants/test_mutants.py applies them.
"""

FILE = "00_environment/env_check.py"

MUTANTS = [
    dict(
        name="count_without_is_available",
        why="device_count() trusted alone: a broken driver reports GPUs nobody can use",
        old="    if not torch.cuda.is_available():\n        return 0\n",
        new="",
        caught_by="zero_when_cuda_is_unusable",
    ),
    dict(
        name="nccl_without_a_gpu",
        why="nccl chosen whenever the build has it, even on a machine without GPUs",
        old="if cuda_device_count() > 0 and dist.is_available() and dist.is_nccl_available():",
        new="if dist.is_available() and dist.is_nccl_available():",
        caught_by="pick_backend",
    ),
    dict(
        name="cudnn_version_as_text",
        why="library_report turns the cuDNN version into text (and None into 'None')",
        old='"cudnn_version": torch.backends.cudnn.version() if cudnn_available else None,',
        new='"cudnn_version": str(torch.backends.cudnn.version()),',
        caught_by="library_report",
    ),
    dict(
        name="cuda_device_without_gpus",
        why="device_for returns cuda:<rank> even on a CPU-only machine",
        old='    if gpus == 0:\n        return torch.device("cpu")\n',
        new="",
        caught_by="without_gpus_is_cpu",
    ),
    dict(
        name="two_ranks_share_a_gpu",
        why="device_for lets a rank beyond the GPU count through",
        old="    if local_rank >= gpus:\n",
        new="    if local_rank >= gpus + 1:\n",
        caught_by="rejects_a_rank",
    ),
]

ALTERNATIVES = [
    dict(
        name="count_in_one_expression",
        why="cuda_device_count as one conditional expression",
        old=(
            "    if not torch.cuda.is_available():\n        return 0\n"
            "    return torch.cuda.device_count()\n"
        ),
        new="    return torch.cuda.device_count() if torch.cuda.is_available() else 0\n",
    ),
]
