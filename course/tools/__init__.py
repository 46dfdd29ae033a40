"""The course's command-line tools (python -m course ...)."""
