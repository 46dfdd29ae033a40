"""The grader: everything that grades a submission."""
