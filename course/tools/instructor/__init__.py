"""The tools an instructor runs to grade a class: locally, on Gradescope, on GitHub Classroom."""
