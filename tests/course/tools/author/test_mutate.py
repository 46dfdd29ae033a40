"""python -m course mutate: the engine's operators (cosmic-ray's and the course's plugin)
mutate only what a student writes, each mutant is graded by the tests that read its file,
and each record on the site matches today's solution files (the engine itself never runs
in CI: it grades a lesson hundreds of times)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("cosmic_ray", reason="the mutation engine is a dev extra (cosmic-ray)")

from cosmic_ray.mutating import mutate_code  # noqa: E402

from course import REPO_ROOT, registry  # noqa: E402
from course.tools.author import mutant_grade, mutate, mutation_operators  # noqa: E402

RECORDS = sorted(mutate.FOLDER.glob("mutation-*.json"))


@pytest.mark.parametrize(
    ("name", "example"),
    [(n, e) for n, op in mutation_operators.OPERATORS.items() for e in op.examples()],
)
def test_the_courses_operators_make_their_mistakes(name, example):
    operator = mutation_operators.OPERATORS[name]()
    assert mutate_code(example.pre_mutation_code, operator, example.occurrence) == (
        example.post_mutation_code
    )


def test_the_engine_knows_every_operator_by_name():
    cr = mutate.engine()
    for name in mutate.OPERATORS:
        assert cr.plugins.get_operator(name) is not None, name


SOURCE = """import torch.distributed as dist


def outside(x):
    dist.barrier()
    return x + 1


def inside(x, group):
    ### BEGIN SOLUTION
    dist.all_reduce(x, group=group)
    y = x.clone()
    ### END SOLUTION
    return y
"""


def test_only_the_solution_blocks_are_mutated(tmp_path):
    path = tmp_path / "lesson.py"
    path.write_text(SOURCE)
    assert mutate.solution_lines(SOURCE) == {11, 12}
    found = mutate.mutants(path)
    assert found and all(m["line"] in (11, 12) for m in found), found
    changes = {(m["operator"], m["after"]) for m in found}
    assert ("course/DeleteStatement", "pass") in changes  # the all-reduce left out
    assert ("course/DropKeyword", "dist.all_reduce(x)") in changes  # its group= left out
    assert ("course/DropCall", "y = x") in changes  # the clone left out
    assert not any("barrier" in m["before"] or "x + 1" in m["before"] for m in found)


def test_a_debugging_exercises_fix_is_mutated_not_its_bug():
    """Lesson 09's exercises keep the bug (commented, for the starter) above `### FIX`: the
    lines a student writes are those between FIX and END BUG."""
    source = ("def join():\n"
              "    ### BEGIN BUG\n"
              "    #| dist.init_process_group(backend)\n"
              "    ### FIX\n"
              "    store = make_store()\n"
              "    dist.init_process_group(backend, store=store, timeout=limit)\n"
              "    ### END BUG\n"
              "    return 1\n")  # fmt: skip
    assert mutate.solution_lines(source) == {5, 6}


def test_a_mutant_of_an_exercise_file_runs_only_the_tests_that_read_it():
    lesson = registry.get("12")
    ring = mutant_grade.command(lesson, "impl", "ring.py")
    names = ring[ring.index("-k") + 1].split(" or ")
    test_file = registry.tests(lesson)[0]
    assert set(names) == set(mutant_grade.reading(test_file, "ring.py")) and names
    assert "-x" in ring and "--impl=impl" in ring
    main = mutant_grade.command(lesson, "impl", lesson.script)
    assert "-k" not in main  # every test reads the main file


def test_the_verdict_is_what_the_test_command_printed_last():
    line = 'course-mutant: {"outcome": "killed", "seeds": {"1": "rejected"}, "test": "t"}'
    assert mutate._verdict(f"noise\n{line}\n")["outcome"] == "killed"
    assert mutate._verdict("Traceback ...\nboom")["outcome"] == "error"


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_each_mutation_record_matches_todays_solution(path):
    doc = json.loads(path.read_text())
    assert doc["kind"] == mutate.KIND and doc["engine"] == "cosmic-ray" and len(doc["seeds"]) >= 2
    lesson = registry.get(doc["lesson"])
    for file, seen in doc["files"].items():
        now = mutate.blob(REPO_ROOT / "solutions" / lesson.slug / file)
        assert seen["blob"] == now, (
            f"{path.name} was made from another {lesson.slug}/{file} (blob {seen['blob'][:10]}, "
            f"today {now[:10]}): run `python -m course mutate {lesson.number}` again"
        )
    counts = {o: sum(m["outcome"] == o for m in doc["mutants"]) for o in doc["counts"]}
    assert counts == doc["counts"]
    assert all(m.get("reason") for m in doc["mutants"] if m["outcome"] == "equivalent")


def test_a_changed_solution_makes_its_record_stale(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("x = 2\n")
    assert mutate.blob(a) != mutate.blob(b)
    assert mutate.blob(a) == "7d4290a117a4ddcc11daae7ea675841033830c8f"  # `git hash-object a.py`


def test_triage_marks_the_declared_equivalents_and_scores_again():
    survivor = {"file": "plan.py", "before": "min(p, n)", "after": "min(n, p)",
                "outcome": "survived"}  # fmt: skip
    other = {"file": "plan.py", "before": "a < b", "after": "a <= b", "outcome": "survived"}
    killed = {"file": "plan.py", "before": "x + y", "after": "x - y", "outcome": "killed"}
    doc = {"mutants": [survivor, other, killed]}
    reason = "min is symmetric: the same rows whichever comes first"
    mutate.triage(doc, {"plan.py:min(p, n) -> min(n, p)": reason})
    assert survivor["outcome"] == "equivalent" and survivor["reason"] == reason
    assert other["outcome"] == "survived" and killed["outcome"] == "killed"
    assert doc["counts"]["equivalent"] == 1 and doc["score"] == 50.0  # 1 killed of 2 graded


def test_each_declared_equivalent_names_a_line_of_todays_solution():
    """A declared equivalent whose line left the solution is stale: its reason no longer
    speaks of the reference."""
    for number in [lesson.number for lesson in registry.LESSONS]:
        lesson = registry.get(number)
        for key in mutate.declared(number):
            file, change = key.split(":", 1)
            before = change.split(" -> ")[0]
            source = (REPO_ROOT / "solutions" / lesson.slug / file).read_text()
            assert before in {line.strip() for line in source.splitlines()}, (number, key)


def test_again_grades_only_the_mutants_that_were_not_killed(monkeypatch):
    """--again after new tests: the record's survivors are graded again at the new seeds,
    its killed and equivalent mutants kept as they were, and every seed recorded."""
    made = mutate.mutants(REPO_ROOT / "solutions" / "09_debugging" / "rendezvous.py")
    killed, survivor, equivalent = (
        {"file": "rendezvous.py", **m, "outcome": o} for m, o in
        zip(made[:3], ("killed", "survived", "equivalent"), strict=True)
    )  # fmt: skip
    doc = {"mutants": [killed, survivor, equivalent], "seeds": [1, 2], "planned": len(made)}
    graded = []

    def grade_one(copies, lesson, case, seeds, deadline):
        graded.append((mutate._id(case), seeds))
        return {**case, "outcome": "killed", "seeds": dict.fromkeys(map(str, seeds), "rejected")}

    monkeypatch.setattr(mutate, "_grade_one", grade_one)
    got = mutate.run("09", 1, [7, 8], only=["rendezvous.py"], again=doc)
    assert graded == [(mutate._id(survivor), [7, 8])]
    assert [m["outcome"] for m in got["mutants"]].count("killed") == 2
    assert got["seeds"] == [1, 2, 7, 8] and got["planned"] == len(made)
    assert got["counts"]["equivalent"] == 1 and got["score"] == 100.0


def test_rest_grades_only_the_mutants_a_stopped_run_never_reached(monkeypatch):
    """--rest after a run stopped by its budget: the mutants it graded are kept whatever
    their outcome, the others graded at the new seeds, and every seed recorded."""
    made = mutate.mutants(REPO_ROOT / "solutions" / "09_debugging" / "rendezvous.py")
    first = [{"file": "rendezvous.py", **m, "outcome": o}
             for m, o in zip(made[:2], ("killed", "survived"), strict=True)]  # fmt: skip
    doc = {"mutants": first, "seeds": [1, 2], "planned": len(made)}
    graded = []

    def grade_one(copies, lesson, case, seeds, deadline):
        graded.append(mutate._id(case))
        return {**case, "outcome": "killed", "seeds": dict.fromkeys(map(str, seeds), "rejected")}

    monkeypatch.setattr(mutate, "_grade_one", grade_one)
    got = mutate.run("09", 1, [7, 8], only=["rendezvous.py"], rest=doc)
    assert sorted(graded) == sorted(mutate._id({"file": "rendezvous.py", **m}) for m in made[2:])
    assert len(got["mutants"]) == len(made) and got["seeds"] == [1, 2, 7, 8]
    assert [m["outcome"] for m in got["mutants"]].count("survived") == 1
    assert got["provenance"]["command"] == "python -m course mutate 09 --rest --seeds 2"
