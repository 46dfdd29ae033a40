"""A job that fails: started by the student's launcher through torchrun, its one process
prints a line and exits with code 3 (tests/lessons/test_07_multinode.py)."""

import os
import sys

print(f"the failing job's rank {os.environ.get('RANK')} exits with code 3", flush=True)
sys.exit(3)
