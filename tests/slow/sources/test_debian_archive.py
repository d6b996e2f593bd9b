"""The real Debian archive through the private apt configuration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodeprep import targets
from nodeprep.digests import sha256_file
from nodeprep.errors import InputError
from nodeprep.sources.debian import DebianArchive

pytestmark = pytest.mark.slow


def test_real_archive_serves_nvidia_packages(test_cache: Path) -> None:
    archive = DebianArchive(test_cache)
    versions = archive.versions("nvidia-kernel-source")
    assert versions and all(v.startswith(("5", "4")) for v in versions)
    headers = archive.packages(r"^linux-headers-6\.1\.0-[0-9]+-amd64$")
    assert headers, "no Debian 12 kernel headers found"
    deb = archive.download("nvidia-smi", versions[0])
    assert deb.name == f"nvidia-smi_{versions[0].replace(':', '%3a')}_amd64.deb"
    assert archive.download("nvidia-smi", versions[0]) == deb  # cached, verified again
    assert len(sha256_file(deb)) == 64
    with pytest.raises(InputError, match="available: " + re.escape(versions[0])):
        archive.download("nvidia-smi", "1.0-1")
    assert not (Path("/etc/apt/sources.list.d") / "nodeprep.list").exists()


def test_download_many_fetches_together_and_reports_bytes(test_cache: Path, tmp_path: Path) -> None:
    """Several packages in one apt run into an empty .deb cache (the apt lists are the test
    cache's): progress goes up to the sum of the sizes apt printed, the files are the archive's
    (sha256 checked), and a second call finds them cached without fetching."""
    archive = DebianArchive(test_cache)
    archive.update()
    archive.debs = tmp_path / "debs"
    specs: list[tuple[str, str | None]] = [("nvidia-modprobe", None), ("nvidia-persistenced", None)]
    seen: list[tuple[int, int | None]] = []
    paths = archive.download_many(specs, lambda done, total: seen.append((done, total)))
    assert [p.name.split("_", 1)[0] for p in paths] == ["nvidia-modprobe", "nvidia-persistenced"]
    total = sum(p.stat().st_size for p in paths)
    assert seen and seen[-1] == (total, total) and {t for _, t in seen} == {total}
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    stamps = [p.stat().st_mtime_ns for p in paths]
    seen.clear()
    assert archive.download_many(specs, lambda done, total: seen.append((done, total))) == paths
    assert seen == [(total, total)] and [p.stat().st_mtime_ns for p in paths] == stamps


def test_real_archive_resolves_trixie_and_the_backports_line(test_cache: Path) -> None:
    """What a build request for debian-13 and for a Debian 12 backports kernel resolves to, asked
    of the real archive (newest served kernel of each line; the driver sources of the line)."""
    from nodeprep.builder import headers
    from nodeprep.sources.drivers import resolve_for_target

    trixie = DebianArchive(test_cache, os_name="debian-13")
    hdrs = headers.resolve(trixie, None)
    assert re.fullmatch(r"6\.12\.\d+\+deb13-amd64", hdrs.release)
    assert [p for p, _ in hdrs.packages][1:] == [
        f"linux-headers-{hdrs.release.removesuffix('-amd64')}-common",
        f"linux-kbuild-{hdrs.release.removesuffix('-amd64')}",
    ]
    src = resolve_for_target(trixie, targets.get("debian-13"), hdrs.release, None, "open")
    assert src.package == "nvidia-open-kernel-source" and src.driver_version.startswith("550.")

    bpo = DebianArchive(test_cache, os_name="debian-12", kernel="6.12.1+deb12-amd64")
    assert bpo.dir.name == "debian-12-backports-amd64"
    kernel = headers.resolve(bpo, None).release  # the backports line's default kernel
    assert re.fullmatch(r"6\.12\.\d+\+deb12-amd64", kernel)
    src = resolve_for_target(bpo, targets.get("debian-12"), kernel, None, "proprietary")
    assert "~bpo12" in src.debian_version and src.package == "nvidia-kernel-source"
    with pytest.raises(InputError, match=r"is not built for debian-12 backports kernel"):
        resolve_for_target(bpo, targets.get("debian-12"), kernel, "535.309.01", "proprietary")
    # the main line keeps bookworm's own 6.1 kernels as its default
    assert headers.resolve(DebianArchive(test_cache), None).release.startswith("6.1.0-")


def test_the_example_inventory_names_drivers_the_archive_serves(test_cache: Path) -> None:
    """inventories/example builds for the current default kernel (resolved at build time, no release
    written: tests/unit/fleet/test_inventory.py); the driver versions it names must still be served
    for that kernel's line, or the example's first build fails. Skipped without the archive."""
    import yaml

    from nodeprep.errors import NetworkError
    from nodeprep.sources.drivers import resolve_for_target
    from tests.support.fixtures import REPO

    group_vars = REPO / "inventories/example/group_vars"
    build = yaml.safe_load((group_vars / "build_hosts.yml").read_text())
    nodes = yaml.safe_load((group_vars / "all.yml").read_text())
    assert build["driver_build_kernels"] == []  # the current default kernel
    wanted = {*build["driver_build_versions"], nodes["nvidia_driver_version"]}
    try:
        archive = DebianArchive(test_cache)
        archive.update()
    except (NetworkError, InputError) as e:
        pytest.skip(f"no Debian archive here: {e}")
    for version in sorted(wanted):
        source = resolve_for_target(archive, targets.get(targets.DEFAULT), None, version,
                                    build["driver_build_flavour"])
        assert source.driver_version == version
