"""Build matrix files: the schema check (every problem one `field: message`), the cells as written,
`nodeprep build-matrix FILE` output parsed back, and the refusal logic of `--expand`.

The refusal tests answer the archive from data recorded from Debian's real archive
(tests/fixtures/debian-archive: debian12-archive.json, debian12-backports-archive.json,
debian13-archive.json; see their _comment) through `RecordedArchive` at the archive boundary only.
What the expansion gives against the real archive is tests/slow/builder/test_matrix_expand.py.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nodeprep import targets
from nodeprep.builder import matrix, parallel
from nodeprep.cli import main
from nodeprep.targets import limits
from tests.support.recordedarchive import RecordedArchive, recorded

YAML = """
os: debian-12
drivers: [535.309.01, "525", latest]
kernels: [6.1.0-56-amd64, 6.1.0-50-amd64]
flavours: [proprietary, open]
exclude:
  - {driver: "525", flavour: open}
  - {driver: latest, kernel: 6.1.0-50-amd64}
"""


def test_cells_as_written_with_excludes():
    cells = matrix.parse(YAML).cells()
    assert len(cells) == 3 * 2 * 2 - 2 - 2
    assert matrix.Cell("debian-12", "525", "open", "6.1.0-56-amd64") not in cells
    assert matrix.Cell("debian-12", None, "proprietary", "6.1.0-50-amd64") not in cells
    assert matrix.Cell("debian-12", None, "open", "6.1.0-56-amd64") in cells
    assert cells[0].args() == [
        "--os", "debian-12", "--flavour", "proprietary", "--driver", "535.309.01",
        "--kernel", "6.1.0-56-amd64",
    ]


def test_build_work_is_one_request_per_cell_with_its_os_resolved(tmp_path):
    """`build-matrix --build`: every cell becomes the BuildRequest build-driver would make for its
    args (the OS resolved to its TargetOS), the CPUs shared among the cells built at once."""
    cells = matrix.parse("os: [debian-12, debian-13]\ndrivers: [\"535\"]\n").cells()
    work = matrix.build_work(cells, 2, 9, store=tmp_path / "s", cache=tmp_path / "c", rebuild=False,
                             userspace=True, smoke_test=None)
    assert [d for d, _ in work] == [c.to_dict() for c in cells]
    reqs = [r for _, r in work]
    assert [r.target for r in reqs] == [targets.get("debian-12"), targets.get("debian-13")]
    assert {(r.driver, r.flavour, r.kernel, r.jobs, r.store, r.smoke_test) for r in reqs} == {
        ("535", "proprietary", None, 4, tmp_path / "s", None)}
    assert matrix.build_work(cells, 4, 2, store=tmp_path / "s", cache=tmp_path / "c")[0][1].jobs == 1
    results = [{"ok": True, "name": str(tmp_path / "a.tar.zst"), "userspace": None},
               {"ok": False, "name": None}, {"ok": True, "name": "b.tar.zst", "userspace": "u.tar.zst"}]
    assert parallel.published(results) == ["a.tar.zst", "b.tar.zst", "u.tar.zst"]


def test_defaults():
    assert matrix.parse("drivers: [535]\n").cells() == [matrix.Cell("debian-12", "535", "proprietary", None)]


def test_every_problem_is_reported_with_its_field_and_line():
    with pytest.raises(matrix.MatrixError) as e:
        matrix.parse(
            "os: [debian-14]\ndrivers: [abc, 535]\nflavours: [closed]\nkernel: x\nexclude: [{arch: arm64}]\n"
            "kernels: [default, {channel: bpo, newest: 0}, {newest: 2, default: true}, 5]\n",
            source="m.yaml",
        )
    assert e.value.problems == [
        "kernel: unknown key (known: os, kernels, drivers, flavours, exclude, open_source, companions) "
        "(line 4)",
        "drivers[0]: 'abc' is not a driver version or branch (or 'default') (line 2)",
        "exclude[0].arch: unknown key (known: os, driver, kernel, flavour) (line 5)",
        "flavours[0]: 'closed' is not one of proprietary, open (line 3)",
        "kernels[1].channel: 'bpo' is not a kernel channel (backports, main) (line 6)",
        "kernels[1].newest: must be a whole number of at least 1 (line 6)",
        "kernels[2]: takes newest: N or default: true, not both (line 6)",
        "kernels[3]: 5 is not a kernel release, 'default' or {channel: NAME, newest: N} (line 6)",
        "os[0]: unknown OS 'debian-14' (known: debian-12, debian-13, rhel-9, ubuntu-22.04, ubuntu-24.04)"
        " (line 1)",
    ]


def test_cli_prints_matrix_json(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(YAML)
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data) == ["include"] and len(data["include"]) == 8
    assert data["include"][0]["args"][:2] == ["--os", "debian-12"]


def test_cli_bad_matrix_exits_2_with_one_line(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("drivers: {a: 1}\n")
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    assert res.exit_code == 2
    assert res.stderr.splitlines()[0] == f"error: {f}: drivers: must be a non-empty list (line 1)"
    res = CliRunner().invoke(main, ["build-matrix", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "missing.yaml" in res.stderr
    f.write_text("kernels: [{channel: backports}]\n")  # a channel selector needs the archive
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {f}: kernels: 'backports:default' is resolved against the archive")


# -- refusals (recorded archive data) ---------------------------------------------------------

RECORDED = {
    ("debian-12", "main"): "debian12-archive.json",
    ("debian-12", "backports"): "debian12-backports-archive.json",
    ("debian-13", "main"): "debian13-archive.json",
    ("debian-13", "backports"): "debian13-backports-archive.json",
}


def _archive_for(os_name: str, channel: str) -> RecordedArchive:
    return recorded(RECORDED[os_name, channel])


def _refused(text: str) -> dict[tuple[str, str, str, str], str]:
    expansion = matrix.expand(matrix.parse(text), _archive_for)
    return {(r.os, r.kernel, r.driver, r.flavour): r.reason for r in expansion.refused}


def test_open_flavour_of_a_branch_without_open_modules_is_refused():
    refused = _refused("kernels: [6.1.0-56-amd64]\ndrivers: ['470', '525']\nflavours: [open]\n")
    assert refused[("debian-12", "6.1.0-56-amd64", "470", "open")] == (
        "branch 470 has no open kernel modules (NVIDIA publishes them from R515 on)")
    # 525 has open modules upstream, but Debian 12 serves none of that branch
    assert refused[("debian-12", "6.1.0-56-amd64", "525", "open")].startswith(
        "driver 525 (open) is not served by Debian's archive (served: ")


def test_driver_too_old_for_the_kernel_is_refused_with_the_known_failure():
    """550.163.01 against trixie's 6.12.117 (the recorded default): refused in both flavours, for
    the default driver and for the exact version; 535.274.02 on the same kernel is not refused."""
    refused = _refused(
        "os: debian-13\ndrivers: [default, 550.163.01, '535']\nflavours: [proprietary, open]\n")
    reason = refused[("debian-13", "6.12.117+deb13-amd64", "default", "open")]
    assert "pci_resize_resource" in reason and "6.12.107" in reason
    assert refused[("debian-13", "6.12.117+deb13-amd64", "550.163.01", "proprietary")] == reason
    assert ("debian-13", "6.12.117+deb13-amd64", "535", "proprietary") not in refused
    assert refused[("debian-13", "6.12.117+deb13-amd64", "535", "open")].startswith(
        "driver 535 (open) is not served")


def test_kernel_limit_boundaries():
    limit = limits.KERNEL_LIMITS[0]
    assert limit.refuses("550.163.01", "open", "6.12.107+deb13-amd64")
    assert limit.refuses("550.163.01", "proprietary", "6.12.117+deb12-amd64")
    assert not limit.refuses("550.163.01", "open", "6.12.94+deb13-amd64")
    assert not limit.refuses("550.163.01", "open", "6.1.0-56-amd64")  # an ABI name: no patch level
    assert not limit.refuses("535.274.02", "open", "6.12.117+deb13-amd64")
    assert limits.refusal("515.43.04", "open", "6.1.0-56-amd64") is None


def test_debian12_open_cell_is_refused_for_kernels_it_does_not_build_against():
    """docs/build.md's support table: 535.261.03 (open) fails against 6.1.0-53 and later (seen for
    6.1.0-56); `--expand` must not offer that cell, only the pinned 6.1.0-50 one."""
    refused = _refused("kernels: [6.1.0-56-amd64, 6.1.0-50-amd64]\ndrivers: [535.261.03]\nflavours: [open]\n")
    reason = refused[("debian-12", "6.1.0-56-amd64", "535.261.03", "open")]
    assert "pci_resize_resource" in reason and "6.1.0-53" in reason
    assert ("debian-12", "6.1.0-50-amd64", "535.261.03", "open") not in refused
    limit = limits.KERNEL_LIMITS[1]
    assert limit.refuses("535.261.03", "open", "6.1.0-53-amd64")
    assert not limit.refuses("535.261.03", "open", "6.1.0-52-amd64")
    assert not limit.refuses("535.261.03", "proprietary", "6.1.0-56-amd64")
    assert not limit.refuses("535.261.03", "open", "6.12.117+deb12-amd64")


def test_backports_channel_refusals():
    """The backports line offers only its ~bpo12 driver builds: a mainline driver and the open
    flavour are refused naming the line's own choices."""
    refused = _refused(
        "kernels: [{channel: backports}]\ndrivers: [535.309.01]\nflavours: [proprietary, open]\n")
    reason = refused[("debian-12", "6.12.95+deb12-amd64", "535.309.01", "proprietary")]
    assert reason.startswith("driver 535.309.01 (proprietary) is not built for debian-12 backports kernel")
    assert "proprietary: 535.216.03, 470.256.02" in reason
    assert ("debian-12", "6.12.95+deb12-amd64", "535.309.01", "open") in refused


def test_kernel_refusals_name_the_kernel_once():
    refused = _refused(
        "os: [debian-12, debian-13, ubuntu-22.04]\n"
        "kernels: [6.1.0-999-amd64, {channel: backports, newest: 1}]\ndrivers: [default, '535']\n")
    assert refused[("debian-12", "6.1.0-999-amd64", "*", "*")].startswith(
        "no headers for kernel 6.1.0-999-amd64 in the archive of debian-12 main (bookworm, bookworm-updates) "
        "(newest: 6.1.0-56-amd64, 6.1.0-50-amd64)")
    assert refused[("debian-13", "6.1.0-999-amd64", "*", "*")].startswith(
        "'6.1.0-999-amd64' is not a kernel release of debian-13")
    assert refused[("ubuntu-22.04", "backports:newest=1", "*", "*")].startswith(
        "ubuntu-22.04 has no kernel channel")
    # trixie-backports' newest kernel exists (7.3.4+deb13): only its line's drivers are asked about
    assert [k for k in refused if k[2] != "*"] == [("debian-13", "7.3.4+deb13-amd64", "535", "proprietary")]


def test_published_schema_is_in_step():
    """nodeprep/data/matrix.schema.json is what json_schema() builds from the vocabularies;
    regenerate with `python -c 'from nodeprep.builder import matrix;
    matrix.SCHEMA_PATH.write_text(matrix.render_schema())'`."""
    assert matrix.SCHEMA_PATH.read_text() == matrix.render_schema()


def test_build_refuses_a_hostile_store_index_before_any_cell(tmp_path):
    """build-matrix --build --store DIR reads DIR's index as install does (artifact.parse_index):
    a name that is a path is one error line, exit 2, before any cell builds or anything is written
    (issue #25). The cells' cache stays empty: nothing was resolved or built."""
    f = tmp_path / "m.yaml"
    f.write_text("os: debian-12\ndrivers: [535.309.01]\nkernels: [6.1.0-56-amd64]\n")
    store, cache = tmp_path / "store", tmp_path / "cache"
    store.mkdir()
    entry = {"name": "../../../tmp/x.tar.zst", "kind": "kmod", "driver_version": "535.309.01",
             "flavour": "proprietary", "kernel_release": "6.1.0-56-amd64", "arch": "amd64",
             "os": "debian-12", "sha256": "0" * 64, "size": 1, "input_digest": "0" * 64}
    (store / "index.json").write_text(json.dumps({"format": 1, "artifacts": [entry]}))
    before = (store / "index.json").read_bytes()
    res = CliRunner().invoke(main, ["build-matrix", str(f), "--build", "--store", str(store),
                                    "--cache", str(cache)])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"{store / 'index.json'}" in errors[0], res.stderr
    assert "../../../tmp/x.tar.zst" in errors[0] and "Traceback" not in res.output
    assert sorted(p.name for p in store.iterdir()) == ["index.json"]
    assert (store / "index.json").read_bytes() == before
    assert not cache.exists() or not any(cache.rglob("*.log"))


# -- --gpus: the driver follows the GPUs (issue 27, item 4) -----------------------------------------

def _lists(os_name: str, channel: str, version: str) -> str | None:
    """The real supported-gpus.json of the versions recorded in tests/unit/data/supported-gpus/."""
    import gzip

    from tests.unit.node.test_branch import DATA as LISTS

    path = LISTS / f"{version}.json.gz"
    return gzip.decompress(path.read_bytes()).decode() if path.is_file() else None


def _follow(text: str, *gpus: str, policy: str = "newest") -> matrix.Expansion:
    return matrix.expand(matrix.parse(text), _archive_for, follow=matrix.FollowGpus(gpus, _lists, policy))


def test_gpus_choose_each_kernels_driver_and_flavour_from_the_lines_lists():
    """A100 (10de:20b2): Debian 12's 535.309.01 lists it, proprietary by default. H200 (10de:2335):
    535.309.01's list does not name it, and trixie's 550.163.01, whose list does, does not build for
    6.12.117 (targets/limits.py): each kernel is refused naming the GPU and the versions tried."""
    text = "os: [debian-12, debian-13]\nkernels: [default]\ndrivers: ['470']\nflavours: [open]\n"
    got = _follow(text, "10de:20b2")
    assert [(c.os, c.kernel, c.driver, c.flavour, c.source) for c in got.cells][0] == (
        "debian-12", "6.1.0-56-amd64", "535.309.01", "proprietary",
        "nvidia-kernel-source=535.309.01-0+deb12u1")
    refused = _follow(text, "10de:2335").refused
    assert [(r.os, r.kernel, r.driver) for r in refused] == [
        ("debian-12", "6.1.0-56-amd64", "*"), ("debian-13", "6.12.117+deb13-amd64", "*")]
    assert refused[0].reason.startswith("no driver version supports every GPU of the node (10de:2335); "
                                        "tried 535.309.01 (newest first): ")
    assert refused[1].reason == "no driver version to choose from"  # 550.163.01 is ruled out here


def test_gpus_on_trixie_backports_take_its_own_driver():
    """trixie-backports' 7.3.4 kernel and its ~bpo13 550.163.01, whose list names the H200 (no known
    build failure rules it out on 7.3); a Blackwell B200 is refused there."""
    text = "os: debian-13\nkernels: [{channel: backports}]\n"
    (cell,) = _follow(text, "10de:2335").cells
    assert (cell.kernel, cell.driver, cell.flavour, cell.source) == (
        "7.3.4+deb13-amd64", "550.163.01", "proprietary", "nvidia-kernel-source=550.163.01-4~bpo13+1")
    (refused,) = _follow(text, "10de:2901").refused
    assert "(PCI 10de:2901) is newer than 550.163.01" in refused.reason


def test_build_matrix_gpus_needs_expand(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("os: debian-12\n")
    res = CliRunner().invoke(main, ["build-matrix", str(f), "--gpus", "10de:2335"])
    assert res.exit_code == 2
    assert res.stderr.splitlines()[0] == (
        "error: --gpus chooses the drivers the archive serves: use it with --expand")
    res = CliRunner().invoke(main, ["build-matrix", str(f), "--expand", "--gpus", "10de:zz"])
    assert res.exit_code == 2 and res.stderr.splitlines()[0].startswith("error: --gpus: '10de:zz'")


# -- open-source releases per kernel (issue 27, item 5) ---------------------------------------------

SHA_580 = "644c8cea8ed92414c7bd4567f200d6f5ed10868728d7f7fb0f06b01319330343"
SHA_595 = "dcec5996ed6f01eddbfd1c316383774e2f504501060218b1d898d04be6af0aa0"
OPEN = f"""
os: [debian-12, debian-13]
kernels: [default, {{channel: backports}}]
drivers: [default]
flavours: [proprietary, open]
open_source:
  - {{release: /releases/open-gpu-kernel-modules-580.142.tar.gz, sha256: {SHA_580}}}
  - {{release: "https://example.invalid/r/open-gpu-kernel-modules-595.45.04.tar.gz", sha256: {SHA_595}}}
"""


def test_expand_lists_per_kernel_which_sources_build_and_the_refusals():
    """Every kernel the recorded archives serve as a line's default, trixie-backports' 7.3.4 included:
    the Debian driver that builds, both releases, and today's refusals with their reasons."""
    expansion = matrix.expand(matrix.parse(OPEN), _archive_for)
    rows = {(r["os"], r["kernel"]): r for r in expansion.by_kernel()}
    assert list(rows) == [("debian-12", "6.1.0-56-amd64"), ("debian-12", "6.12.95+deb12-amd64"),
                          ("debian-13", "6.12.117+deb13-amd64"), ("debian-13", "7.3.4+deb13-amd64")]
    releases = ["open-source:open-gpu-kernel-modules-580.142.tar.gz",
                "open-source:open-gpu-kernel-modules-595.45.04.tar.gz"]
    for (_, kernel), row in rows.items():
        built = [b["source"] for b in row["builds"] if b["source"].startswith("open-source:")]
        # both releases include <linux/of_gpio.h>, which trixie-backports' 7.x kernels no longer have
        assert built == ([] if kernel.startswith("7.") else releases), row
    trixie = rows["debian-13", "6.12.117+deb13-amd64"]
    assert [b["source"] for b in trixie["builds"]] == releases  # 550.163.01 does not build for 6.12.117
    assert {r["flavour"] for r in trixie["refused"]} == {"proprietary", "open"}
    assert all("pci_resize_resource" in r["reason"] for r in trixie["refused"])
    bpo = rows["debian-13", "7.3.4+deb13-amd64"]
    assert {"driver": "550.163.01", "flavour": "proprietary",
            "source": "nvidia-kernel-source=550.163.01-4~bpo13+1"} in bpo["builds"]
    assert {r["driver"]: r["reason"] for r in bpo["refused"]}["open-gpu-kernel-modules-595.45.04.tar.gz"] == (
        "595.45.04 (open) does not build against kernels 7.2 and later: its nv-linux.h includes "
        "<linux/of_gpio.h>, which they removed (fatal error: linux/of_gpio.h: No such file or directory)")
    cell = next(c for c in expansion.cells if c.kernel == "6.12.117+deb13-amd64" and c.driver == "595.45.04")
    assert cell.args() == ["--os", "debian-13", "--flavour", "open", "--open-source",
                           "https://example.invalid/r/open-gpu-kernel-modules-595.45.04.tar.gz",
                           "--open-source-sha256", SHA_595, "--kernel", "6.12.117+deb13-amd64"]


def test_kernel_limits_of_the_releases():
    """595.45.04 seen failing on 7.3.4 (of_gpio.h), 580.142 by the same include: every 7.x kernel, not
    the 6.x ones (ABI-named 6.1.0-NN included)."""
    for version in ("595.45.04", "580.142"):
        assert limits.refusal(version, "open", "7.2.6+deb13-amd64")
        assert limits.refusal(version, "open", "7.3.4+deb13-amd64")
        assert limits.refusal(version, "open", "8.0.1+deb13-amd64")
        assert limits.refusal(version, "open", "6.12.117+deb13-amd64") is None
        assert limits.refusal(version, "open", "6.1.0-56-amd64") is None
    assert limits.refusal("595.45.04", "proprietary", "7.3.4+deb13-amd64") is None


def test_open_source_entries_are_checked_and_written_cells_carry_them(tmp_path):
    with pytest.raises(matrix.MatrixError) as e:
        matrix.parse("open_source:\n  - {release: nvidia.tar.gz, sha256: abc}\n  - {sha256: x}\n")
    assert e.value.problems == [
        "open_source[0].sha256: 'abc' is not a sha256 hex digest (64 hex digits) (line 2)",
        "open_source[1]: must be a list of mappings like {release: URL or path, sha256: HEX} (line 3)",
        "open_source[1].sha256: 'x' is not a sha256 hex digest (64 hex digits) (line 3)",
    ]
    with pytest.raises(matrix.MatrixError) as e:
        matrix.parse("open_source:\n  - {release: nvidia.tar.gz, sha256: '" + "a" * 64 + "'}\n")
    assert e.value.problems == ["open_source[0].release: 'nvidia.tar.gz' is not named "
                                "open-gpu-kernel-modules-<version>.tar.gz (an NVIDIA release)"]
    f = tmp_path / "m.yaml"
    f.write_text(OPEN)
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    assert res.exit_code == 2 and "is resolved against the archive" in res.stderr
    f.write_text(OPEN.replace("kernels: [default, {channel: backports}]", "kernels: [6.1.0-56-amd64]"))
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    cells = json.loads(res.stdout)["include"]
    assert [c["driver"] for c in cells if c["flavour"] == "open" and "--open-source" in c["args"]] == [
        "580.142", "595.45.04", "580.142", "595.45.04"]
    res = CliRunner().invoke(main, ["build-matrix", str(f), "--by-kernel"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --by-kernel lists what --expand finds")


SHA = {k: c * 64 for k, c in (("persistenced", "a"), ("fabricmanager", "b"), ("nvidia_fs", "c"),
                               ("gdrcopy", "d"))}
COMPANIONS = f"""
os: debian-12
drivers: [535.309.01, "580"]
kernels: [6.1.0-57-amd64]
companions:
  "535.309.01":
    persistenced:
      url: "https://example.com/p/nvidia-persistenced-535.309.01.tar.gz"
      sha256: "{SHA['persistenced']}"
    fabricmanager:
      url: https://example.com/fm/fabricmanager-linux-x86_64-535.309.01-archive.tar.xz
      sha256: "{SHA['fabricmanager'].upper()}"
    nvidia_fs: {{url: /srv/src/gds-nvidia-fs-2.28.4.tar.gz, sha256: "{SHA['nvidia_fs']}"}}
    gdrcopy: {{url: "file:///srv/src/gdrcopy-2.6.tar.gz", sha256: "{SHA['gdrcopy']}"}}
"""


def test_companions_go_to_the_cells_of_their_driver_and_to_build_driver(tmp_path):
    """`companions:` per exact driver version: that driver's cells carry build-driver's flags (and the
    same BuildRequest for --build); another driver's cells nothing."""
    cells = matrix.parse(COMPANIONS).cells()
    ours, other = cells
    assert other.driver == "580" and other.companions == () and "--fabricmanager" not in other.args()
    assert ours.args() == [
        "--os", "debian-12", "--flavour", "proprietary", "--driver", "535.309.01",
        "--kernel", "6.1.0-57-amd64",
        "--persistenced-source", "https://example.com/p/nvidia-persistenced-535.309.01.tar.gz",
        "--persistenced-sha256", SHA["persistenced"],
        "--fabricmanager", "https://example.com/fm/fabricmanager-linux-x86_64-535.309.01-archive.tar.xz",
        "--fabricmanager-sha256", SHA["fabricmanager"],  # lower-cased
        "--nvidia-fs", "/srv/src/gds-nvidia-fs-2.28.4.tar.gz", "--nvidia-fs-sha256", SHA["nvidia_fs"],
        "--gdrcopy", "file:///srv/src/gdrcopy-2.6.tar.gz", "--gdrcopy-sha256", SHA["gdrcopy"]]
    (_, req), (_, req2) = matrix.build_work(cells, 1, 2, store=tmp_path / "s", cache=tmp_path / "c")
    assert (req.persistenced_source, req.persistenced_sha256) == (
        "https://example.com/p/nvidia-persistenced-535.309.01.tar.gz", SHA["persistenced"])
    assert req.fabricmanager_sha256 == SHA["fabricmanager"] and req.fabricmanager.endswith("-archive.tar.xz")
    assert req.companions == (("nvidia-fs", "/srv/src/gds-nvidia-fs-2.28.4.tar.gz", SHA["nvidia_fs"]),
                              ("gdrdrv", "file:///srv/src/gdrcopy-2.6.tar.gz", SHA["gdrcopy"]))
    assert (req2.persistenced_source, req2.fabricmanager, req2.companions) == (None, None, ())
    # the CLI's JSON, what CI's build jobs run build-driver with
    f = tmp_path / "m.yaml"
    f.write_text(COMPANIONS)
    res = CliRunner().invoke(main, ["build-matrix", str(f)])
    assert res.exit_code == 0, res.output
    include = json.loads(res.stdout)["include"]
    assert include[0]["args"] == ours.args() and include[0]["companions"][0][0] == "persistenced"


def test_expanded_cells_get_the_companions_of_the_version_they_resolve_to():
    text = ("os: debian-12\ndrivers: [default]\nkernels: [6.1.0-56-amd64]\ncompanions:\n  \"535.309.01\":\n"
            f"    gdrcopy: {{url: gdrcopy-2.6.tar.gz, sha256: \"{SHA['gdrcopy']}\"}}\n")
    cells = matrix.expand(matrix.parse(text), _archive_for).cells
    assert [(c.driver, c.companions) for c in cells] == [
        ("535.309.01", (("gdrcopy", "gdrcopy-2.6.tar.gz", SHA["gdrcopy"]),))]


@pytest.mark.parametrize(("entry", "problems"), [
    ('"535": {gdrcopy: {url: g.tar.gz, sha256: "' + "d" * 64 + '"}}',
     ["companions: '535' is not an exact driver version (e.g. 535.309.01) (line 2)"]),
    ('"535.309.01": {gdrcopy: {url: g.tar.gz, sha256: "xyz"}}',
     ["companions.535.309.01.gdrcopy.sha256: 'xyz' is not a sha256 hex digest (64 hex digits) (line 2)"]),
    ('"535.309.01": {gdrcopy: {url: "g.tar.gz\\n--rebuild", sha256: "' + "d" * 64 + '"}}',
     ["companions.535.309.01.gdrcopy.url: must be the file's URL or path (one line) (line 2)"]),
    ('"535.309.01": {gdrcopy: {url: g.tar.gz}, nvidia_fs: {url: "", sha256: "' + "c" * 64 + '"}}',
     ["companions.535.309.01.gdrcopy: must be a mapping {url: URL or path, sha256: HEX} (line 2)",
      "companions.535.309.01.nvidia_fs.url: must be the file's URL or path (one line) (line 2)"]),
    ('"535.309.01": {imex: {url: i.tar.gz, sha256: "' + "e" * 64 + '"}}',
     ["companions.535.309.01.imex: unknown key (known: persistenced, fabricmanager, nvidia_fs, gdrcopy) "
      "(line 2)"]),
    ('"535.309.01": {}', ["companions.535.309.01: must be a mapping with any of persistenced, "
                          "fabricmanager, nvidia_fs, gdrcopy (line 2)"]),
    ('"535.309.01": {fabricmanager: {url: "https://x/fabricmanager-linux-x86_64-590.48.01-archive.tar.xz", '
     'sha256: "' + "b" * 64 + '"}}',
     ["companions.535.309.01.fabricmanager.url: fabricmanager-linux-x86_64-590.48.01-archive.tar.xz is "
      "version 590.48.01, not the driver's 535.309.01 (it must be the driver's exact version)"]),
    ('"535.309.01": {persistenced: {url: "../../etc/passwd", sha256: "' + "a" * 64 + '"}}',
     ["companions.535.309.01.persistenced.url: '../../etc/passwd' is not named "
      "nvidia-persistenced-<version>.tar.gz"]),
], ids=["branch-key", "sha256", "newline", "missing-and-empty", "unknown-key", "empty", "fm-version",
        "persistenced-name"])
def test_hostile_companions_are_refused_with_their_field(entry, problems):
    with pytest.raises(matrix.MatrixError) as e:
        matrix.parse(f"drivers: [535.309.01]\ncompanions: {{{entry}}}\n")
    assert e.value.problems == problems
