"""`radixlm.lang` and the interpreter's public API import without torch or the runtime."""

from __future__ import annotations

import subprocess
import sys


def test_language_imports_without_torch():
    code = (
        "import sys, radixlm.interpreter.api, radixlm.lang.tracer, radixlm.interpreter.html\n"
        "heavy = [m for m in ('torch', 'transformers', 'radixlm.runtime', 'IPython') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
