"""llama.cpp's own HF -> GGUF converter (`convert_hf_to_gguf.py`, its `conversion/` package and its
own `gguf-py`), run as a subprocess on tiny checkpoints: an independent writer of GGUF files for
tests/models/test_gguf_converter.py. It ships inside the llama-cpp-python sdist on PyPI; `./dev
test` fetches that once and keeps only the converter under `.venv/llama-cpp-converter/` (see
`dev`). A missing converter fails the tests that need it (never a skip).

The converter writes a tokenizer into every file, so each checkpoint folder needs one it accepts:
a `tokenizer.model` (SentencePiece; Llama, Mistral, Mixtral, Qwen2/3, Gemma 2/3, Phi-3 take it),
or, where it insists on a byte-level BPE vocabulary whose pre-tokenizer it recognises by hash
(Qwen2-MoE, Qwen3-MoE), the default model's (SmolLM2, 49152 tokens: the checkpoint's vocabulary
must be that large).

Run as a script (`python llama_cpp_converter.py JOBS.json`) it is the driver of one subprocess
that runs the converter on every job in turn (torch and transformers are imported once). It then
imports nothing of radixlm nor the installed `gguf` before the converter, which must use its own
`gguf-py`."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ENV_DIR = "RADIXLM_LLAMA_CPP_CONVERTER"  # overrides the folder (a llama.cpp checkout will do)


def converter_dir() -> Path:
    """The folder holding `convert_hf_to_gguf.py` (raises, with the fix, when it is missing)."""
    folder = Path(os.environ.get(ENV_DIR) or Path(sys.prefix) / "llama-cpp-converter")
    if not (folder / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(
            f"llama.cpp's converter is not in {folder}: `./dev test` fetches it "
            f"(or set {ENV_DIR} to a llama.cpp checkout)"
        )
    return folder


def convert(jobs: list[tuple[str, str, str]], log_path: str) -> None:
    """Run the converter on each (checkpoint folder, outtype, output file), in one subprocess;
    raises with the log's tail if any conversion fails."""
    folder = converter_dir()
    spec = Path(log_path).with_suffix(".jobs.json")
    spec.write_text(json.dumps({"converter": str(folder), "jobs": jobs}))
    env = dict(os.environ)  # NOTE: its own gguf-py (NO_LOCAL_GGUF would take the installed one)
    env.pop("NO_LOCAL_GGUF", None)
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, __file__, str(spec)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    if proc.returncode != 0:
        tail = Path(log_path).read_text()[-4000:]
        raise RuntimeError(f"llama.cpp's converter failed (log {log_path}):\n{tail}")


def write_sentencepiece_tokenizer(folder: str) -> None:
    """A tiny SentencePiece `tokenizer.model` (64 pieces: <unk> <s> </s> ...; the converter pads
    the vocabulary to the config's `vocab_size` with [PAD] tokens)."""
    import io

    import sentencepiece as spm

    words = [f"w{i} x{i % 7} y{i % 13}" for i in range(2000)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(words),
        model_writer=buf,
        vocab_size=64,
        model_type="bpe",
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
    )
    Path(folder, "tokenizer.model").write_bytes(buf.getvalue())


BPE_VOCAB = 49152  # the default model's (SmolLM2) vocabulary


@functools.cache
def _default_model_tokenizer() -> Any:
    from radixlm.runtime.frontend.tokenizer import tokenizer_from_gguf
    from radixlm.runtime.models.default_model import default_model_path
    from radixlm.runtime.models.gguf_file import GGUFFile

    tokenizer = tokenizer_from_gguf(GGUFFile(default_model_path()))
    assert len(tokenizer) == BPE_VOCAB, len(tokenizer)
    return tokenizer


def write_bpe_tokenizer(folder: str) -> None:
    """The default model's byte-level BPE tokenizer (rebuilt from its GGUF) as `tokenizer.json`."""
    _default_model_tokenizer().save_pretrained(folder)


def _drive(spec_path: str) -> int:
    """The subprocess: `convert_hf_to_gguf.py` as `__main__`, once per job."""
    import runpy

    spec = json.loads(Path(spec_path).read_text())
    script = os.path.join(spec["converter"], "convert_hf_to_gguf.py")
    sys.path.insert(0, spec["converter"])  # its `conversion` package
    for model_dir, outtype, outfile in spec["jobs"]:
        sys.argv = [script, model_dir, "--outtype", outtype, "--outfile", outfile]
        print(f"=== {' '.join(sys.argv[1:])}", flush=True)
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                return 1
        if not os.path.isfile(outfile):
            print(f"=== no output {outfile}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_drive(sys.argv[1]))
