"""SGLang's own program suite (`sglang.test.test_programs`, from the pinned wheel), importable here.

`test_programs` imports `sglang.srt.utils` (SGLang's *server* helpers) at module level, for
`is_hip`, and `test_gen_min_new_tokens` imports `sglang.srt.utils.hf_transformers_utils` for
`get_tokenizer`. Neither is part of the frontend the suite exercises. `sglang.srt.utils` imports
torchvision, and no torchvision that loads beside the CPU torch (`torch==2.13.0+cpu`) is reachable
from the package registries this project may use (checked 2026-12-02):
- PyPI's torchvision 0.28.0 (the release paired with torch 2.13) for Linux x86-64 is a CUDA build:
  its `_C.so` needs `libc10_cuda.so`, so importing it fails with "operator torchvision::nms does not
  exist"; PyPI has no `+cpu` build and no sdist to build one from;
- the CPU wheels are published only on download.pytorch.org, which is not a package registry this
  workplace reaches (its name does not even resolve on CI);
- Debian's `python3-torchvision` is 0.14.1, built for torch 1.13.
When the real module does not import, `load_test_programs` registers a stand-in with exactly those
two names: `is_hip()` is False (no ROCm here) and `get_tokenizer(path)` loads the tokenizer
radixlm's server loads. Where a CPU torchvision is installed, the real module is used.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any


def _stand_in_srt_utils(reason: str) -> None:
    from radixlm.runtime.frontend.tokenizer import load_tokenizer

    utils = types.ModuleType("sglang.srt.utils")
    utils.__doc__ = f"radixlm's test stand-in for SGLang's server helpers ({reason})"
    utils.is_hip = lambda: False  # type: ignore[attr-defined]
    utils.__path__ = []  # type: ignore[attr-defined]  # a package: the submodule below
    hf_utils = types.ModuleType("sglang.srt.utils.hf_transformers_utils")

    def get_tokenizer(tokenizer_name: str, *args: Any, **kwargs: Any) -> Any:
        return load_tokenizer(os.fspath(tokenizer_name))

    hf_utils.get_tokenizer = get_tokenizer  # type: ignore[attr-defined]
    utils.hf_transformers_utils = hf_utils  # type: ignore[attr-defined]
    sys.modules["sglang.srt.utils"] = utils
    sys.modules["sglang.srt.utils.hf_transformers_utils"] = hf_utils


def load_test_programs() -> types.ModuleType:
    """`sglang.test.test_programs`, with the stand-in above only where the real helpers fail."""
    try:
        import sglang.srt.utils  # noqa: F401
    except (ImportError, RuntimeError) as exc:  # torchvision: "operator ... does not exist"
        _stand_in_srt_utils(f"{type(exc).__name__}: {exc}")
    from sglang.test import test_programs

    return test_programs


# The suite's own imports, rewritten to radixlm's names for the run "with `import radixlm as sgl`".
_RADIXLM_IMPORTS = (
    ("import sglang as sgl", "import radixlm as sgl"),
    ("from sglang.lang.ir import", "from radixlm.lang.sampling import"),
)


def load_test_programs_as_radixlm() -> types.ModuleType:
    """The same suite, its source compiled with `import radixlm as sgl` in place of
    `import sglang as sgl` (every program then uses radixlm's language); SGLang's helper imports
    (`sglang.utils`, `sglang.srt.utils...`) stay."""
    upstream = load_test_programs()
    assert upstream.__file__ is not None
    with open(upstream.__file__) as f:
        source = f.read()
    for old, new in _RADIXLM_IMPORTS:
        assert old in source, f"the pinned suite changed: {old!r} not found"
        source = source.replace(old, new)
    module = types.ModuleType("radixlm_test_programs")
    module.__file__ = upstream.__file__
    exec(compile(source, upstream.__file__, "exec"), module.__dict__)
    return module
