"""Prefix caches by name: classes implementing `prefix_cache.PrefixCache`, constructed by the
scheduler as `cls(req_to_token, allocator)` (`radix_cache.make_prefix_cache`: "none" with
`disable_radix_cache`, else "radix")."""

from __future__ import annotations

from radixlm.runtime.registry import Registry

PREFIX_CACHES: Registry[type] = Registry("prefix cache")
PREFIX_CACHES.register("radix", "radixlm.runtime.mem.radix_cache:RadixCache")
PREFIX_CACHES.register("none", "radixlm.runtime.mem.prefix_cache:NoPrefixCache")
