"""`nodeprep build-matrix --expand` against the real Debian archive (apt lists under the test cache,
the same index build-driver reads; no compile): the cells that exist, the refused ones, and the
GitHub Actions matrix JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nodeprep.builder import headers
from nodeprep.sources.debian import DebianArchive

from .test_real_build import cli

pytestmark = pytest.mark.slow

MATRIX = """
os: [debian-12, debian-13]
kernels:
  - default
  - {channel: main, newest: 2}
  - {channel: backports}
  - 6.12.117+deb13-amd64
  - 6.12.94+deb13-amd64
drivers: [default, "535", "470"]
flavours: [proprietary, open]
exclude:
  - {os: debian-12, kernel: 6.12.117+deb13-amd64}
  - {os: debian-12, kernel: 6.12.94+deb13-amd64}
"""


def test_expand_against_the_real_archive(test_cache: Path, tmp_path: Path) -> None:
    f = tmp_path / "matrix.yaml"
    f.write_text(MATRIX)
    res = cli("build-matrix", str(f), "--expand", "--json", "--cache", str(test_cache))
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert list(data) == ["include"]  # GitHub Actions' strategy.matrix shape, nothing else
    cells = data["include"]
    keys = [(c["os"], c["kernel"], c["driver"], c["flavour"]) for c in cells]
    assert len(keys) == len(set(keys)), "a cell twice"

    # every cell exists in its archive: the kernel's headers and the driver source package version
    for c in cells:
        archive = DebianArchive(test_cache, os_name=c["os"], channel=c["channel"])
        assert archive.versions(f"linux-headers-{c['kernel']}"), c
        package, version = c["source"].split("=", 1)
        assert version in archive.versions(package), c
        assert c["args"] == ["--os", c["os"], "--flavour", c["flavour"], "--driver", c["driver"],
                             "--kernel", c["kernel"]]

    # "default" is the kernel build-driver picks; "newest 2" the two newest of the main line
    bookworm = DebianArchive(test_cache)
    default12 = headers.resolve(bookworm, None).release
    assert re.fullmatch(r"6\.1\.0-\d+-amd64", default12)
    main12 = sorted({c["kernel"] for c in cells if c["os"] == "debian-12" and c["channel"] == "main"},
                    key=lambda k: int(k.split("-")[1]), reverse=True)
    assert default12 in main12 and len(main12) == 2
    assert main12 == headers.served_releases(bookworm, match=lambda r: r.startswith("6.1.0-"), limit=2)

    # the backports line: its default 6.12 kernel with the ~bpo12 driver builds only, no open cell
    bpo = [c for c in cells if c["channel"] == "backports" and c["os"] == "debian-12"]
    assert bpo and all(re.fullmatch(r"6\.12\.\d+\+deb12-amd64", c["kernel"]) for c in bpo)
    assert all("~bpo12" in c["source"] and c["flavour"] == "proprietary" for c in bpo)
    assert {c["driver"] for c in bpo} >= {"470.256.02"} and any(c["driver"].startswith("535.") for c in bpo)

    # trixie 6.12.117 builds the tesla-535 branch (seen for real: CELLS["debian13-tesla"]); the
    # refusals name their reason
    assert ("debian-13", "6.12.117+deb13-amd64", "535.274.02", "proprietary") in keys
    refused = [line for line in res.stderr.splitlines() if line.startswith("refused: ")]
    assert all(re.match(r"refused: \S+ \S+ \S+ \S+: .+", line) for line in refused)
    for os_name, kernel in {(c["os"], c["kernel"]) for c in cells} | {("debian-12", default12)}:
        assert f"refused: {os_name} {kernel} 470 open: branch 470 has no open kernel modules" in res.stderr
    # trixie-backports (issue 27): its newer series, with its ~bpo13 driver builds only
    bpo13 = [c for c in cells if c["channel"] == "backports" and c["os"] == "debian-13"]
    assert bpo13 and all(re.fullmatch(r"\d+\.\d+\.\d+\+deb13-amd64", c["kernel"]) for c in bpo13)
    assert all(not c["kernel"].startswith("6.12.") and "~bpo13" in c["source"] for c in bpo13), bpo13
    assert "6.12.117+deb13-amd64" not in {c["kernel"] for c in cells if c["os"] == "debian-12"}  # excluded
    # 6.12.94, the kernel trixie's 550.163.01 last built against, has left the archive: one line
    # names it and the kernels served instead
    gone = "refused: debian-13 6.12.94+deb13-amd64 * *: no headers for kernel 6.12.94+deb13-amd64 in the"
    assert gone in res.stderr
    assert "6.12.94+deb13-amd64" not in {c["kernel"] for c in cells}
    trixie = headers.resolve(DebianArchive(test_cache, os_name="debian-13"), None).release
    if tuple(map(int, trixie.split("+")[0].split("."))) >= (6, 12, 107):
        assert ("debian-13", trixie, "550.163.01", "open") not in keys
        assert re.search(rf"refused: debian-13 {re.escape(trixie)} default open: .*pci_resize_resource",
                         res.stderr)


def test_build_expanded_matrix_in_parallel(real_build, tmp_path: Path) -> None:
    """`build-matrix --expand --build -j 2`: the refused cell is reported and not built, the
    existing one (the real build's, a cache hit in a copy of its store) is built from the exact
    versions the expansion resolved; one shared cache."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(real_build.store, store, ignore=shutil.ignore_patterns(".lock"))
    f = tmp_path / "matrix.yaml"
    f.write_text(f"kernels: [{real_build.kernel_release}]\ndrivers: [{real_build.driver_version}, '470']\n"
                 "flavours: [proprietary, open]\nexclude: [{driver: '470', flavour: proprietary}, "
                 "{driver: " + real_build.driver_version + ", flavour: open}]\n")
    res = cli("build-matrix", str(f), "--expand", "--build", "-j", "2", "--store", str(store), "--cache",
              str(real_build.cache), "--no-smoke-test", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    assert data["failed"] == 0 and len(data["results"]) == 1
    (only,) = data["results"]
    assert only["ok"] and only["cached"] is True and only["name"] == real_build.kmod.name
    assert only["cell"]["source"].startswith("nvidia-kernel-source=") or "tesla" in only["cell"]["source"]
    assert [(r["driver"], r["flavour"]) for r in data["refused"]] == [("470", "open")]
    assert f"refused: debian-12 {real_build.kernel_release} 470 open: branch 470 has no open" in res.stderr


def test_expand_by_kernel_lists_which_sources_build_for_every_served_kernel(test_cache: Path,
                                                                           tmp_path: Path) -> None:
    """Issue 27, item 5: `build-matrix --expand --by-kernel` with NVIDIA's releases as inputs, against
    the live archive: every kernel the lines serve (the 3 newest of trixie's and of trixie-backports',
    7.3 among them) gets the Debian drivers and releases that build for it and today's refusals."""
    from tests.support.realbuild import OPEN_RELEASES

    releases = "".join(f"  - {{release: /r/open-gpu-kernel-modules-{v}.tar.gz, sha256: {sha}}}\n"
                       for v, sha in OPEN_RELEASES.items())
    f = tmp_path / "matrix.yaml"
    f.write_text("os: debian-13\nkernels: [{channel: main, newest: 3}, {channel: backports, newest: 3}]\n"
                 "drivers: [default, '535']\nflavours: [proprietary, open]\nopen_source:\n" + releases)
    res = cli("build-matrix", str(f), "--expand", "--by-kernel", "--cache", str(test_cache))
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["kernels"]
    kernels = [r["kernel"] for r in rows]
    assert len(kernels) == 6 and any(k.startswith("7.3.") for k in kernels), kernels
    served = headers.served_releases(DebianArchive(test_cache, os_name="debian-13", channel="backports"),
                                     match=lambda r: not r.startswith("6.12."), limit=3)
    assert served == [k for k in kernels if not k.startswith("6.12.")]
    for row in rows:
        sources = [b["source"] for b in row["builds"]]
        opened = [s for s in sources if s.startswith("open-source:")]
        if row["kernel"].startswith("6.12."):
            assert opened == [f"open-source:open-gpu-kernel-modules-{v}.tar.gz" for v in OPEN_RELEASES], row
        else:  # their nv-linux.h includes <linux/of_gpio.h>, gone from 7.2 on (targets/limits.py)
            assert opened == [] and sum("of_gpio.h" in r["reason"] for r in row["refused"]) == 2, row
        assert all(r["reason"] for r in row["refused"]), row
        if row["kernel"].startswith("6.12."):  # trixie's own: tesla-535 builds, 550.163.01 is refused
            assert any(s.startswith("nvidia-tesla-535-kernel-source=") for s in sources), row
            assert any("pci_resize_resource" in r["reason"] for r in row["refused"]), row
        else:
            assert all("~bpo13" in s for s in sources if not s.startswith("open-source:")), row


def test_expand_follows_the_gpus_against_the_real_archive(test_cache: Path, tmp_path: Path) -> None:
    """`--expand --gpus` over the live archive, each candidate judged by its own supported-gpus.json
    (fetched from its user-space package): an A100 gets Debian 12's newest 535 where every version
    lists it; an H200 is refused on every line whose drivers do not list it, naming the GPU and
    every version tried, and gets the newest line's driver that does (trixie-backports' 550); a
    Blackwell B200 gets nothing, each kernel refused naming it."""
    f = tmp_path / "matrix.yaml"
    f.write_text("os: [debian-12, debian-13]\nkernels: [default, {channel: backports}]\n")

    def expand(gpu: str) -> tuple[list[dict], list[str]]:
        res = cli("build-matrix", str(f), "--expand", "--json", "--gpus", gpu, "--cache", str(test_cache))
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)["include"], [ln for ln in res.stderr.splitlines()
                                                    if ln.startswith("refused: ")]

    a100, refused = expand("10de:20b2")
    main12 = [c for c in a100 if c["os"] == "debian-12" and c["channel"] == "main"]
    assert len(main12) == 1 and main12[0]["driver"].startswith("535."), a100
    assert main12[0]["flavour"] == "proprietary"
    assert not [r for r in refused if r.startswith("refused: debian-12 6.1.0-")], refused

    h200, refused = expand("10de:2335")
    assert all(c["os"] == "debian-13" and c["channel"] == "backports" for c in h200), h200
    assert [c["driver"].split(".")[0] for c in h200] == ["550"] * len(h200) and h200
    refused12 = [r for r in refused if r.startswith("refused: debian-12 ")]
    assert len(refused12) == 2, refused
    for line in refused12:
        assert "no driver version supports every GPU of the node (10de:2335); tried 535." in line, line
        assert "is not in the supported-GPU list of 535." in line, line

    b200, refused = expand("10de:2901")
    assert b200 == [] and refused and all("10de:2901" in r for r in refused), refused
