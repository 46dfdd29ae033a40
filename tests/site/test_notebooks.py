"""The site's notebooks run top to bottom on a CPU and show what their text promises.

The site renders them without executing (for a fast build); this test is what
keeps them working. Each runs in a fresh kernel of this interpreter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="jupytext is not installed")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
pytest.importorskip("ipykernel", reason="ipykernel is not installed")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "docs" / "notebooks"
CELL_TIMEOUT_S = 180
KERNEL = "course-notebook-test"

# What each notebook must print: the claims its text makes.
EXPECTED = {
    "01_devices_and_dataparallel.py": [
        "device_ids: []",
        "state_dict keys gain a prefix: ['module.",
        "loading dp.module.state_dict(): ok",
        "same gradient as one big batch: True",
    ],
    "02_ddp_from_a_notebook.py": [
        "mp.spawn raised -> ProcessExitedException",
        "AttributeError: Can't get attribute 'hello'",
        "Both ranks saw different data but ended with identical weights.",
        "torchrun: both ranks agree on the weights.",
    ],
}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory, monkeypatch_module):
    """A kernel spec that runs this very interpreter, whatever else is installed."""
    data = tmp_path_factory.mktemp("jupyter")
    spec = data / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "course tests", "language": "python"})
    )
    monkeypatch_module.setenv("JUPYTER_PATH", str(data))
    return KERNEL


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
    return "\n".join(text)


def test_every_notebook_is_tested():
    # A Chinese twin (NN_name.zh.py) runs the same code cells: tests/site/test_translation.py
    # holds it to them.
    found = [p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.py") if not p.name.endswith(".zh.py")]
    assert sorted(found) == sorted(EXPECTED)


@pytest.mark.timeout(2 * CELL_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_on_cpu(name, kernel):
    nb = jupytext.read(NOTEBOOKS / name)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=60,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{name}: a cell failed:\n{str(exc)[-3000:]}", pytrace=False)
    printed = outputs(nb)
    missing = [line for line in EXPECTED[name] if line not in printed]
    assert not missing, f"{name} did not print {missing}; it printed:\n{printed}"
