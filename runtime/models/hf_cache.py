"""Hugging Face repo ids resolved from the local Hugging Face cache, never from the network.

`Qwen/Qwen3-0.6B` -> `<cache>/models--Qwen--Qwen3-0.6B/snapshots/<commit>` where <commit> is
`refs/main` (the revision `huggingface_hub` last downloaded), else the newest snapshot folder.
<cache> is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (read at call
time, as `huggingface_hub` does at import).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING, TypeVar

from radixlm.runtime.models.default_model import ModelNotFoundError

if TYPE_CHECKING:
    from radixlm.runtime.server_args import ServerArgs

ServerArgsT = TypeVar("ServerArgsT", bound="ServerArgs")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hf_cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "huggingface"
    )
    return os.path.join(home, "hub")


def is_repo_id(path: str) -> bool:
    return bool(_REPO_ID.match(path)) and not os.path.exists(path)


def local_model_path(path: str) -> str:
    """`path` itself when it exists; a repo id's cached snapshot folder; else ModelNotFoundError
    saying where it looked."""
    if os.path.exists(path):
        return path
    if not is_repo_id(path):
        raise ModelNotFoundError(
            f"model path {path!r} does not exist (models are never downloaded)"
        )
    cache = hf_cache_dir()
    root = os.path.join(cache, "models--" + path.replace("/", "--"))
    snapshots = os.path.join(root, "snapshots")
    ref = os.path.join(root, "refs", "main")
    if os.path.isfile(ref):
        with open(ref) as f:
            snap = os.path.join(snapshots, f.read().strip())
        if os.path.isdir(snap):
            return snap
    if os.path.isdir(snapshots):
        found = [os.path.join(snapshots, d) for d in os.listdir(snapshots)]
        found = [d for d in found if os.path.isdir(d)]
        if found:
            return max(found, key=os.path.getmtime)
    raise ModelNotFoundError(
        f"{path!r} is not a local path and is not in the Hugging Face cache ({root} not found); "
        "models are never downloaded: fetch it first (e.g. `huggingface-cli download "
        f"{path}`) or pass a local directory / GGUF file"
    )


def resolve_cached_model(args: ServerArgsT) -> ServerArgsT:
    """`args` with a repo id `model_path` replaced by its cached snapshot folder (its name kept
    as `served_model_name` unless one is set)."""
    local = local_model_path(args.model_path)
    return dataclasses.replace(
        args, model_path=local, served_model_name=args.served_model_name or args.model_path
    )
