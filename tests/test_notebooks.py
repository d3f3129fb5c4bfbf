"""Every notebook (notebooks/ and the examples') runs top to bottom in a real Jupyter kernel (nbclient); a
cell that raises fails the test. Without a GPU the notebooks take their CPU paths; the Diffusion Policy
example's needs a GPU."""
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "examples").glob("*/*.ipynb"))
GPU_ONLY = {"diffusion_graphs"}


def test_notebooks_are_found():
    assert {nb.stem for nb in NOTEBOOKS} >= {"01_workflow", "diffusion_graphs"}


def _params():
    for nb in NOTEBOOKS:
        marks = [pytest.mark.gpu] if nb.stem in GPU_ONLY else []
        yield pytest.param(nb, id=nb.stem, marks=marks)


def test_notebooks_are_committed_without_outputs():
    for nb_path in NOTEBOOKS:
        nb = nbformat.read(nb_path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{nb_path.name} has outputs"


@pytest.mark.parametrize("path", list(_params()))
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the failing cell and its traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
