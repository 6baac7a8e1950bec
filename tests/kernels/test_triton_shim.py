"""The guarded-import shim: fallback launches and the missing-Triton stub."""

from __future__ import annotations

import pytest

from radixlm.kernels import _triton


class OutOfResources(Exception):  # same name as Triton's exception; matched by name
    pass


def test_launch_with_fallback_remembers_the_fallback() -> None:
    launched: list[str] = []

    def launch(cfg: str) -> None:
        launched.append(cfg)
        if cfg == "big":
            raise OutOfResources("shared memory")

    _triton.launch_with_fallback(("test", 1), launch, "big", "small")
    _triton.launch_with_fallback(("test", 1), launch, "big", "small")
    assert launched == ["big", "small", "small"]  # the second call goes straight to the fallback


def test_launch_with_fallback_reraises_other_errors() -> None:
    def launch(cfg: str) -> None:
        raise ValueError(cfg)

    with pytest.raises(ValueError):
        _triton.launch_with_fallback(("test", 2), launch, "big", "small")


def test_missing_triton_stub_raises_on_launch() -> None:
    def kernel() -> None:
        pass

    stub = _triton._MissingTritonKernel(kernel)
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        stub[(1,)]()


def test_power_of_two_helpers() -> None:
    assert [_triton.next_power_of_2(n) for n in (1, 2, 3, 80, 128)] == [1, 2, 4, 128, 128]
    assert _triton.cdiv(7, 2) == 4 and _triton.cdiv(8, 2) == 4
