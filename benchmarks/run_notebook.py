"""Execute a notebook in a fresh Jupyter kernel and save the executed copy (outputs included).
    python benchmarks/run_notebook.py notebooks/01_workflow.ipynb OUT.ipynb"""
import sys

import nbclient
import nbformat

src, dst = sys.argv[1], sys.argv[2]
nb = nbformat.read(src, as_version=4)
nbclient.NotebookClient(nb, timeout=900, kernel_name="python3").execute()
nbformat.write(nb, dst)
for cell in nb.cells:
    for out in cell.get("outputs", []):
        text = out.get("text", "")
        if "edit -> usable op" in text or "kernelkit" in text[:40]:
            print(text.strip()[:400])
