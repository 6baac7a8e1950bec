"""Loading the tokenizer: from an HF directory (local files only), or built straight from a GGUF's
metadata. A byte-level BPE vocabulary ("gpt2" in GGUF terms: SmolLM, Llama 3, Qwen2) is rebuilt
with the `tokenizers` library in well under a second; other GGUF tokenizers go through
transformers' (slower) converter."""

from __future__ import annotations

import os

# NOTE: `AutoTokenizer` is imported where used: it pulls in torch (~2 s per process), which the
# GGUF path, the main process and the detokenizer otherwise never need.
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.models.default_model import default_model_path
from radixlm.runtime.models.gguf_file import GGUFFile
from radixlm.runtime.server_args import ServerArgs

# GGUF `tokenizer.ggml.pre` -> extra pre-tokenizer in front of the byte-level split.
_DIGIT_SPLIT = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_CONTROL, _USER_DEFINED = 3, 4


def load_server_tokenizer(
    args: ServerArgs, gguf: GGUFFile | None = None
) -> PreTrainedTokenizerBase | None:
    """The tokenizer an engine with `args` uses (None with `skip_tokenizer_init`). From a GGUF (the
    default model) this imports no torch; from an HF folder `AutoTokenizer` does."""
    if args.skip_tokenizer_init:
        return None
    path = args.tokenizer_path or args.model_path or default_model_path()
    if args.load_format == "dummy" and args.tokenizer_path is None and not os.path.exists(path):
        raise InvalidRequestError(
            f"dummy model {path!r} has no tokenizer: pass tokenizer_path=... or skip_tokenizer_init=True",
            "tokenizer_path",
        )
    return load_tokenizer(path, gguf)


def load_tokenizer(path: str, gguf: GGUFFile | None = None) -> PreTrainedTokenizerBase:
    if gguf is not None or path.endswith(".gguf"):
        return tokenizer_from_gguf(gguf or GGUFFile(path))
    if os.path.isfile(path):  # e.g. a config.json: its folder
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path!r} is not a directory")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def tokenizer_from_gguf(gguf: GGUFFile) -> PreTrainedTokenizerBase:
    md = gguf.metadata
    if md.get("tokenizer.ggml.model") != "gpt2":
        from transformers import AutoTokenizer

        folder, name = os.path.split(gguf.path)
        return AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens: list[str] = md["tokenizer.ggml.tokens"]
    types: list[int] = md.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if md.get("tokenizer.ggml.pre") in _DIGIT_SPLIT:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    special = [i for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)]
    tk.add_special_tokens(
        [AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False) for i in special]
    )

    def tok(key: str) -> str | None:
        idx = md.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=tok("bos"),
        eos_token=tok("eos"),
        unk_token=tok("unknown"),
        pad_token=tok("padding"),
        chat_template=md.get("tokenizer.chat_template"),
        add_bos_token=bool(md.get("tokenizer.ggml.add_bos_token", False)),
        clean_up_tokenization_spaces=False,
    )
