import os
import sys

from course.tools.cli import main

try:
    code = main()
except BrokenPipeError:  # `python -m course figures | head`: the reader left, not an error
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second one at exit
    code = 141  # as a shell reports SIGPIPE
raise SystemExit(code)
