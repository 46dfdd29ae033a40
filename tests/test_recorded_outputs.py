"""The outputs the pages show are what the reference prints today.

Each record in docs/results/outputs/ (made by `python -m course record`) is
run again on the CPU, and its output compared line by line with the record,
timings and throughput masked (course/tools/record.py, VOLATILE). Losses may differ
in the last printed digit (relative 1e-3) and accuracies by one test image
(0.3 percentage points of 359), which a different CPU can cause; a changed
line, step count or model fails. Re-record with `python -m course record`.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from course.tools import record

NUMBER = re.compile(r"\d[\d,]*\.?\d*%?")


def numbers_agree(want: str, got: str) -> bool:
    a, b = NUMBER.findall(want), NUMBER.findall(got)
    if len(a) != len(b) or NUMBER.sub("#", want) != NUMBER.sub("#", got):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        fx, fy = float(x.rstrip("%").replace(",", "")), float(y.rstrip("%").replace(",", ""))
        tolerance = 0.3 if x.endswith("%") else 1e-3 * max(abs(fx), 1e-9)
        if "." not in x or abs(fx - fy) > tolerance:
            return False
    return True


def recorded_here(name: str) -> bool:
    return record.load(name)["provenance"]["torch"] == torch.__version__


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Every recording made with this PyTorch run again, all at once, as `course record`
    runs it: {name: RunResult}. The others are skipped by the test: not run for nothing."""
    current = [rec for rec in record.RECORDINGS if recorded_here(rec.name)]
    with ThreadPoolExecutor(max_workers=max(len(current), 1)) as pool:
        futures = {
            rec.name: pool.submit(record.run, rec, tmp_path_factory.mktemp(rec.name))
            for rec in current
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", [r.name for r in record.RECORDINGS])
def test_the_record_matches_what_the_reference_prints(fresh, name):
    doc = record.load(name)
    if not recorded_here(name):
        pytest.skip(
            f"{name} was recorded with PyTorch {doc['provenance']['torch']}, this is "
            f"{torch.__version__}: other versions print other figures"
        )
    result, recording = fresh[name], record.get(name)
    assert not result.timed_out and result.returncode == recording.exit_code, (
        f"{name}: expected exit code {recording.exit_code}\n{result.describe()}"
    )
    want = record.masked(doc["output"]).splitlines()
    got = record.masked(record.cleaned(result.output, recording.keep)).splitlines()
    if not recording.ordered:  # several processes print: compare as sorted lines
        want, got = sorted(want), sorted(got)
    assert len(want) == len(got), (
        f"{name}: the reference now prints {len(got)} lines, the record has {len(want)}; "
        f"re-record with `python -m course record {name}`\n" + "\n".join(got)
    )
    made_on, here = doc["provenance"].get("processor"), record.processor()
    where = (
        f"; it was recorded on {made_on}, this is {here}: another processor's CPU kernels "
        "can print other figures, so re-record only if the code changed"
        if made_on and made_on != here
        else ""
    )
    for old, new in zip(want, got, strict=True):
        assert numbers_agree(old, new), (
            f"{name}: the page shows\n  {old}\nbut the reference now prints\n  {new}\n"
            f"re-record with `python -m course record {name}`{where}"
        )
    assert record.facts(result.output).keys() == doc["facts"].keys()


def test_numbers_agree_is_strict_where_it_must_be():
    line = "epoch 1/3: train loss 1.7860, test loss 1.4093, test accuracy 59.89%, N img/s"
    assert numbers_agree(line, line.replace("1.4093", "1.4094"))
    assert not numbers_agree(line, line.replace("1.4093", "1.4293"))
    assert not numbers_agree(line, line.replace("59.89%", "60.72%"))
    assert not numbers_agree(line, line.replace("epoch 1/3", "epoch 1/4"))
    assert not numbers_agree(line, line.replace("test loss", "val loss"))
