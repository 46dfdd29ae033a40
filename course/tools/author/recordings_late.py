"""What `python -m course record` records for lessons 10 on: the second half of the
catalogue (course/tools/author/recording_catalogue.py has the first, and the Recording
that each entry is), in course order. course/tools/author/record.py records both.
"""

from __future__ import annotations

from course.tools.author.recording_catalogue import Recording

# Lesson 12's ring.py, three ways on 4 gloo ranks.
RING_12 = tuple(
    Recording(f"12_{name}", "12_long_sequences/ring.py",
              ("--nproc", "4", "--backend", "gloo", "--seq", "512", *flags), f"lesson 12, {what}")
    for name, flags, what in (("ring_plain", ("--split", "plain"), "ring attention, cut in 4"),
                              ("ring_zigzag", (), "ring attention, the zig-zag split"),
                              ("gather", ("--attention", "gather"), "the all-gather baseline"))
)  # fmt: skip

LATE = (
    Recording(
        "10_sharded",
        "10_sharding/zero.py",
        ("--nproc", "2", "--backend", "gloo", "--epochs", "2", "--batch-size", "32"),
        "lesson 10, ShardedOptimizer on two gloo ranks",
    ),
    Recording(
        "10_plain",
        "10_sharding/zero.py",
        ("--nproc", "2", "--backend", "gloo", "--epochs", "2", "--batch-size", "32")
        + ("--optimizer", "plain"),
        "lesson 10, AdamW whole on each of two gloo ranks",
    ),
    Recording(
        "10_torch",
        "10_sharding/zero.py",
        ("--nproc", "2", "--backend", "gloo", "--epochs", "2", "--batch-size", "32")
        + ("--optimizer", "torch"),
        "lesson 10, PyTorch's ZeroRedundancyOptimizer on two gloo ranks",
    ),
    Recording(
        "10_fsdp",
        "10_sharding/fsdp.py",
        ("--nproc", "2", "--backend", "gloo"),
        "lesson 10, MiniFSDP on two gloo ranks, TinyLM of width 64 and 2 blocks",
    ),
    Recording(
        "10_fsdp2_save",
        "10_sharding/fsdp2.py",
        ("--nproc", "2", "--backend", "gloo", "--steps", "30", "--checkpoint", "ckpt"),
        "lesson 10, FSDP2 on two gloo ranks, a distributed checkpoint saved at step 30",
    ),
    Recording(
        "10_fsdp2_resume",
        "10_sharding/fsdp2.py",
        ("--nproc", "3", "--backend", "gloo", "--steps", "60", "--checkpoint", "ckpt"),
        "lesson 10, FSDP2: the checkpoint two ranks saved at step 30, resumed on three",
        before=("--nproc", "2", "--backend", "gloo", "--steps", "30", "--checkpoint", "ckpt"),
    ),
    Recording(
        "10_fsdp2_straight",
        "10_sharding/fsdp2.py",
        ("--nproc", "2", "--backend", "gloo", "--steps", "60"),
        "lesson 10, FSDP2 on two gloo ranks, 60 steps without a stop",
    ),
    Recording(
        "10_fsdp2_whole",
        "10_sharding/fsdp2.py",
        ("--nproc", "2", "--backend", "gloo", "--steps", "1", "--compute-dtype", "bf16")
        + ("--no-reshard-after-forward",),
        "lesson 10, FSDP2 without resharding after forward: every block stays whole",
        keep=r"^\d+ ranks, logits",
    ),
    Recording(
        "10_memory",
        "",
        ("--nproc", "2", "--backend", "gloo"),
        "lesson 10, the bytes each way of sharding keeps per rank, predicted and counted",
        verb="memory",
    ),
    Recording(
        "10_fsdp_wide",
        "10_sharding/fsdp.py",
        ("--nproc", "2", "--backend", "gloo", "--dim", "256", "--depth", "4", "--steps", "5"),
        "lesson 10, MiniFSDP, TinyLM of width 256 and 4 blocks",
    ),
    Recording(
        "11_1f1b",
        "11_model_parallel/pipeline.py",
        ("--nproc", "2", "--backend", "gloo", "--schedule", "1f1b", "--micro-batches", "8")
        + ("--steps", "20"),
        "lesson 11, 1F1B on two gloo stages, 8 micro-batches",
        ordered=False,
    ),
    Recording(
        "11_bubble_4",
        "11_model_parallel/pipeline.py",
        ("--nproc", "3", "--backend", "gloo", "--schedule", "1f1b", "--stage-ms", "20")
        + ("--steps", "4", "--micro-batches", "4", "--batch-size", "48"),
        "lesson 11, the bubble of 1F1B on three stages, 4 micro-batches",
        ordered=False,
    ),
    Recording(
        "11_bubble_12",
        "11_model_parallel/pipeline.py",
        ("--nproc", "3", "--backend", "gloo", "--schedule", "1f1b", "--stage-ms", "20")
        + ("--steps", "4", "--micro-batches", "12", "--batch-size", "48"),
        "lesson 11, the bubble of 1F1B on three stages, 12 micro-batches",
        ordered=False,
    ),
    Recording(
        "11_tensor",
        "11_model_parallel/tensor.py",
        ("--nproc", "2", "--backend", "gloo", "--steps", "20"),
        "lesson 11, every block's MLP split across two gloo ranks by hand",
    ),
    Recording(
        "12_hand",
        "12_long_sequences/checkpoint.py",
        ("--device", "cpu", "--steps", "30"),
        "lesson 12, a transformer trained with every block checkpointed by hand",
    ),
    Recording(
        "12_sweep",
        "12_long_sequences/checkpoint.py",
        ("--device", "cpu", "--sweep", "64", "128", "256", "--batch-size", "4", "--depth", "2"),
        "lesson 12, what each way of checkpointing keeps, and its step time, on a CPU",
    ),
    Recording(
        "12_sweep_gpu",
        "12_long_sequences/checkpoint.py",
        ("--device", "cuda", "--sweep", "1024", "2048", "4096", "--batch-size", "4")
        + ("--dim", "512", "--heads", "8"),
        "lesson 12, the same on one GPU: bytes from the CUDA allocator",
        gpus=1,
    ),
    *RING_12,
    Recording(
        "13_aux",
        "13_experts/moe.py",
        ("--device", "cpu"),
        "lesson 13, 8 experts, top-2, trained with the balancing loss",
    ),
    Recording(
        "13_no_aux",
        "13_experts/moe.py",
        ("--device", "cpu", "--aux-weight", "0"),
        "lesson 13, the same without the balancing loss",
    ),
    Recording(
        "13_experts",
        "13_experts/experts.py",
        ("--nproc", "4", "--backend", "gloo", "--data-parallel", "2"),
        "lesson 13, experts split over 2 ranks, twice (2 x 2), on gloo",
    ),
    Recording(
        "13_time_gpu",
        "13_experts/moe.py",
        ("--device", "cuda", "--time", "--dim", "1024", "--batch-size", "256"),
        "lesson 13, one MoE layer against a dense MLP of the same active parameters, one GPU",
        gpus=1,
    ),
    Recording(
        "15_plan_llama",
        "",
        ("--model", "llama-8b", "--gpus", "256", "--gpu", "h100-80gb", "--top", "8"),
        "lesson 15, the meshes of 256 H100s that fit Llama 3.1 8B, fastest first",
        verb="plan",
    ),
    Recording(
        "15_check_1024",
        "",
        ("--model", "course-14", "--gpus", "1024", "--gpu", "h100-80gb", "--batch", "256")
        + ("--top", "8", "--check", "8", "--rank", "1000"),
        "lesson 15, rank 1000 of 1024 stepped on the fake backend, predicted and counted",
        verb="plan",
    ),
)
