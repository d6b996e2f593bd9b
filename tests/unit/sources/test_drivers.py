"""Driver version + flavour -> Debian source package, against versions recorded from Debian 12's
archive (tests/fixtures/debian-archive/debian12-archive.json; see tests/support/recordedarchive.py)."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError
from nodeprep.sources import drivers


def catalog(recorded_archive):
    return drivers.load_catalog(recorded_archive)


def test_catalog_has_every_kernel_source_package(recorded_archive):
    cat = catalog(recorded_archive)
    assert set(cat) == {
        "nvidia-kernel-source",
        "nvidia-open-kernel-source",
        "nvidia-tesla-535-kernel-source",
        "nvidia-tesla-kernel-source",
        "nvidia-tesla-470-kernel-source",
    }


def test_default_is_newest_proprietary(recorded_archive):
    src = drivers.resolve(catalog(recorded_archive), None, "proprietary")
    assert (src.package, src.debian_version, src.driver_version) == (
        "nvidia-kernel-source",
        "535.309.01-0+deb12u1",
        "535.309.01",
    )
    assert src.tarball == "usr/src/nvidia-kernel.tar.xz"


def test_open_flavour_uses_open_package(recorded_archive):
    src = drivers.resolve(catalog(recorded_archive), None, "open")
    assert (src.package, src.driver_version, src.flavour) == (
        "nvidia-open-kernel-source",
        "535.261.03",
        "open",
    )


@pytest.mark.parametrize(
    "wanted, package, version",
    [
        ("535", "nvidia-kernel-source", "535.309.01"),
        ("535.261.03", "nvidia-kernel-source", "535.261.03"),
        ("535.216.03", "nvidia-tesla-535-kernel-source", "535.216.03"),
        ("525", "nvidia-tesla-kernel-source", "525.147.05"),
        ("470.256.02", "nvidia-tesla-470-kernel-source", "470.256.02"),
    ],
)
def test_version_and_branch_mapping(recorded_archive, wanted, package, version):
    src = drivers.resolve(catalog(recorded_archive), wanted, "proprietary")
    assert (src.package, src.driver_version) == (package, version)
    assert src.debian_version in recorded_archive.data["kernel_source_versions"][package]


def test_served_versions_per_flavour(recorded_archive):
    served = drivers.served_versions(catalog(recorded_archive))
    assert served["proprietary"] == ["535.309.01", "535.261.03", "535.216.03", "525.147.05", "470.256.02"]
    assert served["open"] == ["535.261.03"]


def test_unknown_version_lists_served_versions_per_flavour(recorded_archive):
    with pytest.raises(InputError) as e:
        drivers.resolve(catalog(recorded_archive), "550.54.14", "proprietary")
    msg = str(e.value)
    assert "550.54.14" in msg
    assert "proprietary: 535.309.01, 535.261.03, 535.216.03, 525.147.05, 470.256.02" in msg
    assert "open: 535.261.03" in msg
    assert "\n" not in msg


def test_version_served_only_as_proprietary_is_refused_for_open(recorded_archive):
    with pytest.raises(InputError, match=r"driver 470.256.02 \(open\) is not served"):
        drivers.resolve(catalog(recorded_archive), "470.256.02", "open")


@pytest.mark.parametrize("bad", ["latest", "535.x", "53", "535.309.01.1", ""])
def test_malformed_version(recorded_archive, bad):
    with pytest.raises(InputError, match="--driver"):
        drivers.resolve(catalog(recorded_archive), bad, "proprietary")


def test_bad_flavour(recorded_archive):
    with pytest.raises(InputError, match="--flavour: 'closed'"):
        drivers.resolve(catalog(recorded_archive), None, "closed")


@pytest.mark.parametrize(
    "debver, driver",
    [
        ("535.309.01-0+deb12u1", "535.309.01"),
        ("535.216.03-3~deb12u1", "535.216.03"),
        ("525.147.05-15~deb12u1", "525.147.05"),
        ("1:470.256.02-1", "470.256.02"),
    ],
)
def test_debian_version_to_driver(debver, driver):
    assert drivers.debian_version_to_driver(debver) == driver


def test_package_flavour():
    assert drivers.package_flavour("nvidia-tesla-535-open-kernel-source") == "open"
    assert drivers.package_flavour("nvidia-tesla-kernel-source") == "proprietary"
    assert drivers.package_flavour("nvidia-kernel-dkms") is None
