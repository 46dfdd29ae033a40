"""Support package for the multi-GPU training course.

It holds the plumbing that every lesson shares (processes, ports, logging,
lesson discovery) and the grader, so that lesson files can stay about one idea.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

__all__ = ["REPO_ROOT"]
