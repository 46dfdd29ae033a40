"""The measuring kit: what a rank sends, holds and calls while a by-hand exercise runs (the
recorder, the meter, the tripwires, the seeded draws, the fake world's counter). The grader,
the probes and the tools use it; it imports none of them (tests/course/test_layout.py)."""
