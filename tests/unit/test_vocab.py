"""The patterns and the version order spelled once in nodeprep.vocab, at their edges, and the
places that used to spell them differently now answering the same."""

from __future__ import annotations

import pytest

from nodeprep.builder import headers, matrix
from nodeprep.builder.kernelfetch import fetch_kernel
from nodeprep.errors import InputError
from nodeprep.sources import opensource
from nodeprep.vocab import DRIVER_REQUEST_RE, DRIVER_VERSION_RE, KERNEL_RELEASE_RE, version_key

DRIVER_VERSIONS = ["535.309.01", "550.54.14", "470.256.02", "580.142", "575.57.08", "390.157"]
NOT_DRIVER_VERSIONS = ["535", "535.", "535.309.1", "535.309.012", "1535.309.01", "53.309.01", "535.3.01",
                       "535.309.01\n", " 535.309.01", "535-309-01", "535.309.01.1", "", "v535.309.01"]
KERNELS = ["6.1.0-28-amd64", "6.12.117+deb13-amd64", "6.1.0-28-rt-amd64", "6.1.0-56-cloud-amd64",
           "5.14.0-427.13.1.el9_4.x86_64", "6.8.0-45-generic", "6.12.9+bpo-amd64", "6.1", "6.1.0~rc1"]
NOT_KERNELS = ["", "6", "6.", "amd64", "../../etc", "6.1.0/../../x", "6.1.0-28-amd64\n", "6.1.0 28",
               "6.1.0-28-amd64/", "12345.1.0", "6.1." + "a" * 130, "-6.1.0", "6.1.0-28-amd64;rm"]


@pytest.mark.parametrize("text", DRIVER_VERSIONS)
def test_driver_versions(text: str) -> None:
    assert DRIVER_VERSION_RE.fullmatch(text) and DRIVER_REQUEST_RE.fullmatch(text)


@pytest.mark.parametrize("text", NOT_DRIVER_VERSIONS)
def test_not_driver_versions(text: str) -> None:
    assert not DRIVER_VERSION_RE.fullmatch(text)


def test_a_build_may_ask_for_a_branch_but_nothing_looser() -> None:
    assert DRIVER_REQUEST_RE.fullmatch("535") and DRIVER_REQUEST_RE.fullmatch("535.309")
    for text in ("53", "5350", "535.", "535.309.1", "abc", "535\n", "default"):
        assert not DRIVER_REQUEST_RE.fullmatch(text), text


@pytest.mark.parametrize("text", KERNELS)
def test_kernel_releases(text: str) -> None:
    assert KERNEL_RELEASE_RE.fullmatch(text)


@pytest.mark.parametrize("text", NOT_KERNELS)
def test_not_kernel_releases(text: str) -> None:
    assert not KERNEL_RELEASE_RE.fullmatch(text)


def test_version_order_is_numeric() -> None:
    ordered = ["390.157", "470.256.02", "535.99.01", "535.104.05", "535.309.01", "535.309.10", "550.54.14"]
    assert sorted(reversed(ordered), key=version_key) == ordered
    kernels = ["6.1.0-9-amd64", "6.1.0-28-amd64", "6.1.0-100-amd64", "6.12.9+bpo-amd64",
               "6.12.117+deb13-amd64"]
    assert sorted(reversed(kernels), key=version_key) == kernels
    assert version_key("535.309.01") == version_key("535.309.1") == (535, 309, 1)
    assert version_key("nothing") == () < version_key("1")


def test_the_former_copies_answer_alike() -> None:
    """The matrix schema published headers' own release pattern (x.y.z then '-' or '+'), and the
    smoke test's kernel fetch took '6' and '6..': both use the one kernel-release pattern now."""
    names = [f"linux-headers-{k}" for k in ("6.1.0-28-amd64", "6.1.0-28-common", "6.1.0-9-amd64", "x-amd64")]
    assert headers.all_releases(names) == ["6.1.0-28-amd64", "6.1.0-9-amd64"]
    assert headers.available_releases(names, "amd64") == ["6.1.0-28-amd64", "6.1.0-9-amd64"]
    for bad in ("6", "6..", "../6.1"):
        with pytest.raises(InputError, match="invalid kernel release"):
            fetch_kernel(bad, archive=None, cache=None)  # type: ignore[arg-type]
    assert opensource.name_version("open-gpu-kernel-modules-580.142.tar.gz") == "580.142"
    assert opensource.name_version("open-gpu-kernel-modules-580.1420.tar.gz") is None
    schema = matrix.json_schema()["properties"]
    assert {"type": "string", "pattern": DRIVER_REQUEST_RE.pattern} in schema["drivers"]["items"]["anyOf"]
    assert {"type": "string", "pattern": KERNEL_RELEASE_RE.pattern} in schema["kernels"]["items"]["anyOf"]
