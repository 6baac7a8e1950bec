"""`radixlm.lang` and the interpreter's public API import without torch or the runtime; the
engine's own process loads the default tokenizer without torch."""

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


def test_engine_process_loads_the_default_tokenizer_without_torch():
    """Only the scheduler needs torch: the user's process (engine, tokenizer manager, HTTP server)
    and the detokenizer skip its ~2 s import (with three processes starting on two cores, the
    scheduler's start-up is what everyone waits for)."""
    code = (
        "import sys, radixlm.runtime.frontend.engine, radixlm.runtime.server.app, radixlm.runtime.frontend.detokenizer\n"
        "from radixlm.runtime.server_args import ServerArgs\n"
        "from radixlm.runtime.frontend.tokenizer import load_server_tokenizer\n"
        "assert load_server_tokenizer(ServerArgs()).encode('Hello') == [19556]\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
