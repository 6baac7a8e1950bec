"""`RouterArgs`: every option of `radixlm router` (sgl-router's flag names where one exists).

Frozen once built; `radixlm router --flags` and `radixlm serve --dp-size N` both end up here.
Invalid values raise ValueError naming the flag.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from radixlm.router.policy import POLICIES, CacheAwareConfig

_HELP = {
    "worker_urls": "base URLs of the `radixlm serve` workers (more can join via /add_worker)",
    "policy": "how a request picks its worker",
    "cache_threshold": "cache_aware: the prefix-match ratio above which the best match wins",
    "balance_abs_threshold": "cache_aware: shortest queue when max - min load exceeds this ...",
    "balance_rel_threshold": "... and max load exceeds this times the min load",
    "eviction_interval": "seconds between LRU evictions of the approximate trees",
    "max_tree_size": "characters each worker's approximate tree keeps after an eviction",
    "health_check_interval": "seconds between /health checks of every worker",
    "health_check_timeout": "seconds a worker's /health may take",
    "health_failure_threshold": "failed checks in a row after which a worker leaves the pool",
    "api_key": "require `Authorization: Bearer <key>` (forwarded to the workers as given)",
    "random_seed": "seed of the random policy",
}


@dataclass(frozen=True)
class RouterArgs:
    worker_urls: tuple[str, ...] = field(default_factory=tuple)
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "cache_aware"
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001
    eviction_interval: float = 60.0
    max_tree_size: int = 2**24
    health_check_interval: float = 5.0
    health_check_timeout: float = 5.0
    health_failure_threshold: int = 2
    api_key: str | None = None
    random_seed: int | None = None
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {POLICIES}, got {self.policy!r}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("--cache-threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0:
            raise ValueError("--balance-abs-threshold must be >= 0")
        if not self.balance_rel_threshold >= 1.0:
            raise ValueError("--balance-rel-threshold must be >= 1")
        if self.max_tree_size < 0:
            raise ValueError("--max-tree-size must be >= 0")
        for name in ("eviction_interval", "health_check_interval", "health_check_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds")
        if self.health_failure_threshold < 1:
            raise ValueError("--health-failure-threshold must be >= 1")
        if not 0 < self.port < 65536:
            raise ValueError("--port must be in 1..65535")
        for url in self.worker_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker URL {url!r} must start with http:// or https://")

    @property
    def cache_aware(self) -> CacheAwareConfig:
        return CacheAwareConfig(
            self.cache_threshold, self.balance_abs_threshold, self.balance_rel_threshold
        )

    @staticmethod
    def build_parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog="radixlm router",
            description="A cache-aware load balancer in front of `radixlm serve` workers.",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        for f in fields(RouterArgs):
            flag = "--" + f.name.replace("_", "-")
            if f.name == "worker_urls":
                parser.add_argument(flag, nargs="+", default=[], metavar="URL", help=_HELP[f.name])
                continue
            kind = float if "float" in str(f.type) else int if "int" in str(f.type) else str
            kwargs: dict = {"type": kind, "default": f.default, "help": _HELP.get(f.name)}
            if f.name == "policy":
                kwargs["choices"] = POLICIES
            parser.add_argument(flag, metavar=f.name.upper(), **kwargs)
        return parser

    @classmethod
    def from_cli(cls, argv: list[str]) -> RouterArgs:
        parser = cls.build_parser()
        ns = parser.parse_args(argv)
        values = {f.name: getattr(ns, f.name) for f in fields(cls)}
        values["worker_urls"] = tuple(values["worker_urls"])
        try:
            return cls(**values)
        except ValueError as exc:
            parser.error(str(exc))
            raise  # unreachable: parser.error exits
