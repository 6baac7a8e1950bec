"""The user-facing material runs: examples/*.py, the notebooks (in a real Jupyter kernel), and
every Python block of docs/language.md (its server examples against `main_server`). Each runs in
its own process on the default model."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOC = ROOT / "docs" / "language.md"
PY_EXAMPLES = sorted(EXAMPLES.glob("*.py"))
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def test_public_api_is_reexported_by_the_package():
    import radixlm
    from radixlm.interpreter.api import LAZY_NAMES, __all__

    missing = [name for name in [*__all__, *LAZY_NAMES] if not hasattr(radixlm, name)]
    assert not missing, f"radixlm/__init__.py does not re-export {missing}"


def test_there_is_enough_material():
    assert len(PY_EXAMPLES) >= 2 and {p.name for p in NOTEBOOKS} >= {
        "tour.ipynb",
        "structured_extraction.ipynb",
    }


@pytest.mark.parametrize("path", PY_EXAMPLES, ids=lambda p: p.name)
def test_python_example_runs(path, engine, capsys):
    """Each example's `main(engine)` on the shared engine (one engine start for all of them)."""
    module = runpy.run_path(str(path), run_name="example")
    module["main"](engine)
    assert capsys.readouterr().out.strip()


def doc_blocks(markdown: str) -> list[str]:
    """The ```python blocks of a markdown file, minus those preceded by `<!-- no-run -->`."""
    blocks = []
    for m in re.finditer(r"(<!-- no-run -->\s*\n)?```python\n(.*?)```", markdown, re.S):
        if not m.group(1):
            blocks.append(m.group(2))
    return blocks


# The server address and API key the doc's examples use; the test points them at `main_server`.
DOC_SERVER_URL = "http://127.0.0.1:30000"
DOC_API_KEY = '"sk-local"'


def test_doc_examples_run(tmp_path, main_server):
    blocks = doc_blocks(DOC.read_text())
    assert len(blocks) >= 6
    source = "\n\n".join(f"# --- block {i}\n{b}" for i, b in enumerate(blocks))
    # NOTE: only the literal address and key change: the backends' examples run as printed.
    assert f"RuntimeEndpoint({DOC_SERVER_URL!r}".replace("'", '"') in source
    assert f"api_key={DOC_API_KEY}" in source
    source = source.replace(DOC_SERVER_URL, main_server.base_url)
    source = source.replace(DOC_API_KEY, repr(main_server.api_key))
    script = tmp_path / "language_md.py"
    script.write_text(source)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-4000:]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, kernel_name):
    import nbclient  # NOTE: test extras: a missing one fails the test, never skips it
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=600,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    client.execute()
    html = [
        o["data"]["text/html"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {})
    ]
    assert any('class="rl-msg"' in h for h in html), "no state was rendered as HTML"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
