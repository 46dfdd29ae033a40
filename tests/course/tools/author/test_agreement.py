"""How a recorded line and today's agree (course/tools/author/agreement.py): figures read
as numbers, each compared as its kind says, with the bands measured between kernels."""

from __future__ import annotations

import pytest

from course.tools.author import agreement
from course.tools.author.agreement import disagreement


def test_figures_are_read_as_numbers_exponents_included():
    line = (
        "rank 3: chunks [3], 4 blocks of 128x128:  65,536 scores, "
        "largest difference from one process 3.0e-07"
    )
    assert [kind for _, kind in agreement.figures(line)][-1] == "noise"
    assert agreement.figures(line)[-1][0] == "3.0e-07"
    # two small numbers, a tenth apart: rounding noise, here and with other kernels
    assert disagreement(line, line.replace("3.0e-07", "3.3e-07"), other_kernels=False) is None
    assert disagreement(line, line.replace("3.0e-07", "3.3e-07"), other_kernels=True) is None
    assert disagreement(line, line.replace("3.0e-07", "1.2e-09"), other_kernels=False) is None
    # ...and a difference that is no longer noise fails
    assert disagreement(line, line.replace("3.0e-07", "3.0e-05"), other_kernels=True)
    assert disagreement(line, line.replace("3.0e-07", "3.0e-02"), other_kernels=False)
    # the exact figures stay exact with other kernels: counts, shapes
    assert disagreement(line, line.replace("65,536", "65,537"), other_kernels=True)
    assert disagreement(line, line.replace("4 blocks", "5 blocks"), other_kernels=True)
    assert disagreement(line, line.replace("128x128", "128x64"), other_kernels=True)


def test_steps_and_bytes_stay_exact_with_other_kernels():
    memory = "MiniFSDP                   17,031,168   17,031,276   1.00"
    assert disagreement(memory, memory.replace("17,031,276", "17,031,277"), other_kernels=True)
    assert disagreement(memory, memory.replace("1.00", "1.10"), other_kernels=True)
    peak = "step 1: allocated at most 12.5 MiB"
    assert disagreement(peak, peak.replace("12.5", "12.6"), other_kernels=True)
    line = "step 300/300: loss 0.0003, busiest expert 1.55 x the mean, dropped 4.3%"
    assert disagreement(line, line.replace("300/300", "301/300"), other_kernels=True)
    assert disagreement(line, line.replace("step 300", "step 299"), other_kernels=True)


def test_a_changed_figure_or_word_fails_with_the_records_kernels():
    line = "epoch 1/3: train loss 1.7860, test loss 1.4093, test accuracy 59.89%, N img/s"
    assert disagreement(line, line.replace("1.4093", "1.4094"), other_kernels=False) is None
    for changed in (
        line.replace("1.4093", "1.4293"),
        line.replace("59.89%", "60.72%"),
        line.replace("epoch 1/3", "epoch 1/4"),
        line.replace("test loss", "val loss"),
    ):
        assert disagreement(line, changed, other_kernels=False), changed  # fmt: skip


def test_another_processor_gets_the_measured_band_and_no_more():
    line = "epoch 2/3: train loss 0.4708, test loss 0.4347, test accuracy 87.19%, N img/s"
    seen = "epoch 2/3: train loss 0.4708, test loss 0.4400, test accuracy 86.36%, N img/s"
    assert disagreement(line, seen, other_kernels=False)  # the Xeon's figures, beyond here's
    assert disagreement(line, seen, other_kernels=True) is None
    for changed in (
        line.replace("0.4347", "0.6347"),
        line.replace("87.19%", "83.19%"),
        line.replace("epoch 2/3", "epoch 2/4"),
    ):
        assert disagreement(line, changed, other_kernels=True), changed  # fmt: skip


def test_a_chaotic_statistic_gets_its_kinds_band():
    """13_no_aux's last step as an Intel Xeon printed it (1.59, 4.2 %) agrees with the
    record's (1.55, 4.3 %) with other kernels, not with the record's own."""
    line = "step 300/300: loss 0.0003, busiest expert 1.55 x the mean, dropped 4.3%"
    xeon = "step 300/300: loss 0.0003, busiest expert 1.59 x the mean, dropped 4.2%"
    assert disagreement(line, xeon, other_kernels=True) is None
    assert disagreement(line, xeon, other_kernels=False)
    assert disagreement(line, line.replace("1.55", "1.95"), other_kernels=True)
    average = (
        "steps 76-300: busiest expert 1.644 x the mean on average, 6.03% of the choices dropped"
    )
    assert disagreement(average, average.replace("1.644", "1.650"), other_kernels=True) is None
    assert disagreement(average, average.replace("1.644", "1.664"), other_kernels=True)
    assert disagreement(average, average.replace("6.03%", "6.23%"), other_kernels=True)


@pytest.mark.parametrize(
    ("line", "figure", "kind"),
    [
        ("epoch 2/3: train loss 0.4708, test loss 0.4347", "0.4347", "a loss"),
        ("final test accuracy 97.49% after 69 steps", "97.49%", "an accuracy"),
        ("final test accuracy 97.49% after 69 steps", "69", "exact"),
        ("step 1: allocated at most 12.5 MiB", "12.5", "exact"),
        ("busiest expert 1.33 x the mean, dropped 1.7%", "1.7%",
         "the share of choices dropped at one step"),
        ("DDP                        33,939,456   33,939,564   1.00", "1.00", "decimal"),
    ],
)  # fmt: skip
def test_the_kind_comes_from_the_words_around_the_figure(line, figure, kind):
    assert dict(agreement.figures(line))[figure] == kind


def test_each_band_is_stated_with_what_it_was_measured_on():
    assert {k.name for k in agreement.BANDED} | {"a difference from a reference"} == set(
        agreement.MEASURED
    )
    assert agreement.last_place("0.1305") == pytest.approx(1e-4)
    assert agreement.last_place("97.49%") == pytest.approx(1e-2)
    assert agreement.last_place("3.0e-07") == pytest.approx(1e-8)
