"""Caches of compiled grammars: an in-memory LRU, a compiler's memory of its compiled specs with
their counters (`CompileCache`), and an optional directory of pickled indexes.

Thread-safety: both are used from the compile worker threads; the LRU takes a lock; the disk
cache writes each entry to a temporary file and renames it into place, so concurrent writers of
the same key (or other processes sharing the directory) never expose a partial file.
NOTE: entries are pickles: the directory must be trusted (it is the operator's own
`grammar_cache_dir`, never data received over the network).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class CompileCache(Generic[V]):
    """A compiler's compiled grammars by key (an LRU) and its counters (`stats`: compiled,
    memory_hits, disk_hits, compile_s). Owned by one compiler, used from its worker threads: two
    workers missing the same key both build it (the last put wins), which only costs time."""

    def __init__(self, capacity: int) -> None:
        self.memory: LRUCache[Hashable, V] = LRUCache(capacity)
        self.stats = {"compiled": 0, "memory_hits": 0, "disk_hits": 0, "compile_s": 0.0}

    def get(self, key: Hashable) -> V | None:
        hit = self.memory.get(key)
        if hit is not None:
            self.stats["memory_hits"] += 1
        return hit

    def get_or_build(self, key: Hashable, build: Callable[[], V]) -> V:
        """The cached value of `key`, else `build()` (timed, counted, kept); `build` raises
        GrammarError for a spec that cannot compile (nothing is kept then)."""
        hit = self.get(key)
        if hit is not None:
            return hit
        start = time.perf_counter()
        value = build()
        self.stats["compiled"] += 1
        self.stats["compile_s"] += time.perf_counter() - start
        self.memory.put(key, value)
        return value


class DiskCache:
    """`key` (any repr-stable value) -> pickled object under `directory`."""

    SUFFIX = ".grammar.pkl"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def path(self, key: Any) -> str:
        digest = hashlib.sha256(repr(key).encode("utf-8")).hexdigest()
        return os.path.join(self.directory, digest + self.SUFFIX)

    def load(self, key: Any) -> Any | None:
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                stored_key, value = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # a corrupt or foreign file: recompile and overwrite it
            logger.warning("ignoring unreadable grammar cache entry %s", path, exc_info=True)
            return None
        return value if stored_key == repr(key) else None

    def store(self, key: Any, value: Any) -> None:
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                pickle.dump((repr(key), value), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path(key))
        except Exception:  # a full disk must not fail the request: the grammar is compiled
            logger.warning("could not write the grammar cache in %s", self.directory, exc_info=True)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
