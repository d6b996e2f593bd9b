"""The CUDA -> minimum driver table (NVIDIA's release-notes table, as data)."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError
from nodeprep.node import cuda


@pytest.mark.parametrize(
    ("toolkit", "driver"),
    [
        ("12.2", "535.54.03"),
        ("12.0", "525.60.13"),
        ("11.8", "520.61.05"),
        ("12.4", "550.54.14"),
        ("13.0", "580.65.06"),
        ("12.2.2", "535.54.03"),
        ("11.0", "450.51.05"),
    ],
)
def test_min_driver(toolkit: str, driver: str) -> None:
    assert cuda.min_driver(toolkit) == driver


def test_max_cuda() -> None:
    assert cuda.max_cuda("535.309.01") == "12.2"
    assert cuda.max_cuda("535.54.03") == "12.2"
    assert cuda.max_cuda("535.54.02") == "12.1"
    assert cuda.max_cuda("525.147.05") == "12.0"
    assert cuda.max_cuda("580.95.05") == "13.0"
    assert cuda.max_cuda("440.33.01") is None


def test_check_messages() -> None:
    ok, msg = cuda.check("12.2", "535.216.03")
    assert ok and "up to CUDA 12.2" in msg
    ok, msg = cuda.check("12.4", "535.309.01")
    assert not ok and "needs driver >= 550.54.14" in msg and "minor-version compatibility" in msg
    ok, msg = cuda.check("13.0", "535.309.01")
    assert not ok and "minor-version" not in msg


def test_table_is_monotonic() -> None:
    rows = sorted(cuda.TOOLKIT_DRIVER.items(), key=lambda kv: cuda.vkey(kv[0]))
    drivers = [cuda.vkey(d) for _, d in rows]
    assert drivers == sorted(drivers)


@pytest.mark.parametrize("bad", ["12", "twelve", "12.7", "99.1", ""])
def test_bad_cuda_version(bad: str) -> None:
    with pytest.raises(InputError, match="--require-cuda"):
        cuda.min_driver(bad)
