"""Target OSes: one entry per OS, and what a build request resolves to for each of them.

The archive is the recorded_archive stand-in (the one boundary): debian13-archive.json and
debian12-backports-archive.json in tests/fixtures/debian-archive were recorded from Debian's real
archive (see their _comment); the CONFIG_CC_VERSION_TEXT lines are copied from the real
linux-headers packages."""

from __future__ import annotations

import pytest

from nodeprep import targets
from nodeprep.builder import buildroot, cc, containerbuild, headers
from nodeprep.builder.resolve import BuildRequest, validate_request
from nodeprep.errors import InputError
from nodeprep.sources import drivers
from tests.support.recordedarchive import recorded

# From .config of linux-headers-6.12.117+deb13-amd64, 6.12.95+deb12-amd64 and 6.1.0-56-amd64.
CC_TEXT = {
    "6.12.117+deb13-amd64": "x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0",
    "6.12.95+deb12-amd64": "x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
}

D12, D13 = targets.get("debian-12"), targets.get("debian-13")


def test_every_target_is_complete_and_unknown_ones_are_refused():
    assert targets.names() == ["debian-12", "debian-13", "rhel-9", "ubuntu-22.04", "ubuntu-24.04"]
    for name in targets.names():
        t = targets.get(name)
        assert t.name == name and t.channels and t.compiler and t.kernel_headers.count("{release}") == 1
        assert set(t.driver_packages) == set(drivers.FLAVOURS)
        assert (t.builder == "chroot") == t.has_buildroot
        assert containerbuild.inner_builder(t) == t.builder
    with pytest.raises(InputError, match=r"^--os: unknown OS 'sles-15' \(known: debian-12, debian-13"):
        targets.get("sles-15")


def test_borrowed_inputs_are_written_in_the_borrowers_entry():
    for name in ("ubuntu-22.04", "ubuntu-24.04", "rhel-9"):
        assert targets.get(name).sources_from == "debian-12" and targets.get(name).borrows_sources
        assert targets.archive(targets.get(name), "5.15.0-105-generic").key == "debian-12"
    assert not targets.get("debian-13").borrows_sources
    assert targets.archive(D13).suites == ("trixie", "trixie-updates")


def test_kernel_names_pick_the_line():
    d12 = targets.get("debian-12")
    assert d12.channel_for("6.1.0-56-amd64").name == "main"
    assert d12.channel_for("6.1.0-56-cloud-amd64").name == "main"
    bpo = d12.channel_for("6.12.95+deb12-amd64")
    assert bpo.name == "backports" and bpo.driver_version_tag == "~bpo12" and bpo.compiler == "gcc-12"
    assert targets.archive(D12, "6.12.95+deb12-amd64").suites[-1] == "bookworm-backports"
    assert targets.get("debian-13").channel_for("6.12.117+deb13-amd64").compiler == "gcc-14"
    with pytest.raises(InputError, match=r"'6.12.117\+deb13-amd64' is not a kernel release of debian-12"):
        targets.channel(d12, "6.12.117+deb13-amd64")
    with pytest.raises(InputError, match="is not a kernel release of debian-13"):
        targets.channel(D13, "6.1.0-56-amd64")


def test_debian13_open_resolves_to_trixie_sources_headers_and_gcc14():
    archive = recorded("debian13-archive.json")
    src = drivers.resolve_for_target(archive, D13, None, None, "open")
    assert (src.package, src.debian_version, src.driver_version) == (
        "nvidia-open-kernel-source", "550.163.01-2", "550.163.01")
    tesla = drivers.resolve_for_target(archive, D13, None, "535", "proprietary")
    assert (tesla.package, tesla.driver_version) == ("nvidia-tesla-535-kernel-source", "535.274.02")
    hdrs = headers.resolve(archive, None)
    assert hdrs.release == "6.12.117+deb13-amd64"
    assert hdrs.packages == (
        ("linux-headers-6.12.117+deb13-amd64", "6.12.117-1"),
        ("linux-headers-6.12.117+deb13-common", "6.12.117-1"),
        ("linux-kbuild-6.12.117+deb13", "6.12.117-1"),
    )
    recipe = buildroot.recipe_for(D13)
    assert recipe.suite == "trixie" and "gcc-14" in recipe.packages and "libelf1t64" in recipe.packages
    # the compiler check: trixie's kernel names x86_64-linux-gnu-gcc-14, which gcc-14 provides
    kernel_cc = cc.Compiler(CC_TEXT[hdrs.release])
    assert kernel_cc.program == "x86_64-linux-gnu-gcc-14" and kernel_cc.version == "14.2.0"
    assert cc.mismatch(kernel_cc, cc.Compiler("x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0")) is None
    assert cc.mismatch(kernel_cc, cc.Compiler("x86_64-linux-gnu-gcc-14 (Debian 12.2.0-14) 12.2.0"))


def test_debian12_backports_kernel_takes_the_backports_driver_and_headers():
    archive = recorded("debian12-backports-archive.json")
    kernel = "6.12.95+deb12-amd64"
    src = drivers.resolve_for_target(archive, D12, kernel, None, "proprietary")
    assert (src.package, src.debian_version, src.driver_version) == (
        "nvidia-kernel-source", "535.216.03-2~bpo12+1", "535.216.03")
    assert drivers.resolve_for_target(archive, D12, kernel, "470", "proprietary").debian_version == (
        "470.256.02-5~bpo12+1")
    hdrs = headers.resolve(archive, kernel)
    assert hdrs.packages == (
        ("linux-headers-6.12.95+deb12-amd64", "6.12.95-1~bpo12+1"),
        ("linux-headers-6.12.95+deb12-common", "6.12.95-1~bpo12+1"),
        ("linux-kbuild-6.12.95+deb12", "6.12.95-1~bpo12+1"),
    )
    # built with bookworm's own gcc-12: Debian 12's build root has the kernel's compiler
    kernel_cc = cc.Compiler(CC_TEXT[kernel])
    assert kernel_cc.version == "12.2.0" and "gcc-12" in buildroot.recipe_for(D12).packages
    # the same archive answers mainline for a 6.1 kernel
    main = drivers.resolve_for_target(archive, D12, "6.1.0-56-amd64", None, "proprietary")
    assert main.debian_version == "535.309.01-0+deb12u1"


def test_mainline_driver_on_a_backports_kernel_names_the_choice():
    archive = recorded("debian12-backports-archive.json")
    with pytest.raises(InputError) as e:
        drivers.resolve_for_target(archive, D12, "6.12.95+deb12-amd64", "535.309.01", "proprietary")
    assert str(e.value).startswith(
        "--driver: driver 535.309.01 (proprietary) is not built for debian-12 backports kernel "
        "6.12.95+deb12-amd64, 6.12 (bookworm-backports), named 6.12.NN+deb12-amd64: the driver sources "
        "of that line (~bpo12) are proprietary: 535.216.03, 470.256.02;")
    with pytest.raises(InputError, match=r"^--flavour: the open flavour is not built for .* \(~bpo12\)"):
        drivers.resolve_for_target(archive, D12, "6.12.95+deb12-amd64", None, "open")


def test_a_custom_kernel_on_a_build_host_takes_the_main_line():
    assert targets.line_kernel(D12, "6.18.44-custom", "host") is None
    assert targets.line_kernel(D12, "6.12.95+deb12-amd64", "host") == "6.12.95+deb12-amd64"
    assert targets.line_kernel(D12, "6.18.44-custom", "chroot") == "6.18.44-custom"  # refused later


def test_requests_for_other_lines_and_builders_are_refused_before_any_download(tmp_path):
    base = dict(store=tmp_path / "s", cache=tmp_path / "c", smoke_test=False)
    rhel9, ubuntu = targets.get("rhel-9"), targets.get("ubuntu-22.04")
    validate_request(BuildRequest(target=D13, kernel="6.12.117+deb13-amd64", **base))
    validate_request(BuildRequest(target=D12, kernel="6.12.95+deb12-amd64", **base))
    with pytest.raises(InputError, match="rhel-9 has no chroot build root"):
        validate_request(BuildRequest(target=rhel9, kernel="5.14.0-427.13.1.el9_4.x86_64", **base))
    validate_request(BuildRequest(target=rhel9, builder="host", **base))
    with pytest.raises(InputError, match="--smoke-test: boots Debian kernels only, not ubuntu-22.04"):
        validate_request(BuildRequest(target=ubuntu, builder="host", **base | {"smoke_test": True}))


def test_backports_line_gets_its_own_build_root_with_pahole() -> None:
    """linux-kbuild-6.12.NN+deb12 depends on pahole (BTF for every module); bookworm's 6.1 line does
    not, so its build root (and every 6.1 artifact's input digest) stays as it was."""
    main = buildroot.recipe_for(D12)
    bpo = buildroot.recipe_for(D12, "6.12.117+deb12-amd64")
    assert "pahole" not in main.packages and buildroot.recipe_for(D12, "6.1.0-50-amd64") == main
    assert bpo.packages == (*main.packages, "pahole") and bpo.key != main.key


def test_trixie_backports_kernels_are_their_own_line():
    """trixie-backports' kernels carry +deb13 like trixie's own (7.3.4+deb13-amd64, recorded in
    data/debian13-backports-archive.json): the series tells the lines apart."""
    d13 = targets.get("debian-13")
    assert d13.channel_for("6.12.117+deb13-amd64").name == "main"
    bpo = d13.channel_for("7.3.4+deb13-amd64")
    assert (bpo.name, bpo.driver_version_tag, bpo.compiler) == ("backports", "~bpo13", "gcc-14")
    assert targets.archive(D13, "7.3.4+deb13-amd64").suites[-1] == "trixie-backports"
    assert "pahole" in buildroot.recipe_for(D13, "7.3.4+deb13-amd64").packages
    archive = recorded("debian13-backports-archive.json")
    assert headers.resolve(archive, None).release == "7.3.4+deb13-amd64"
    src = drivers.resolve_for_target(archive, D13, "7.3.4+deb13-amd64", None, "open")
    assert (src.package, src.debian_version) == ("nvidia-open-kernel-source", "550.163.01-4~bpo13+1")


def test_driver_suite_adds_its_suite_and_is_refused_where_unknown(tmp_path):
    """`--driver-suite experimental`: the target's suites plus experimental, in apt lists of their
    own; anything else, a missing --kernel or another source is refused before any download."""
    a = targets.archive(D12, "6.1.0-50-amd64", "experimental")
    assert (a.suites, a.key, a.driver_suite) == (
        ("bookworm", "bookworm-updates", "experimental"), "debian-12-experimental", "experimental")
    base = dict(store=tmp_path / "s", cache=tmp_path / "c", smoke_test=False, driver="555")
    validate_request(BuildRequest(kernel="6.1.0-50-amd64", driver_suite="experimental", **base))
    with pytest.raises(InputError, match=r"^--driver-suite: 'sid' is not a driver suite of debian-12 "
                                         r"\(known: experimental\)"):
        validate_request(BuildRequest(kernel="6.1.0-50-amd64", driver_suite="sid", **base))
    with pytest.raises(InputError, match="^--driver-suite needs --kernel"):
        validate_request(BuildRequest(driver_suite="experimental", **base))
    with pytest.raises(InputError, match="takes its driver sources from debian-12"):
        targets.archive(targets.get("ubuntu-22.04"), None, "experimental")
    assert not (tmp_path / "c").exists()


def test_driver_suite_picks_only_what_that_suite_serves():
    """`apt-cache madison` lines as apt prints them (Debian 12 with experimental, 2026-11-26): the
    suite's own versions only; the line's own are untouched without a suite."""
    from nodeprep.sources.debian import madison_versions

    out = ("nvidia-kernel-source | 555.58.02-4 | http://deb.debian.org/debian experimental/non-free amd64 "
           "Packages\nnvidia-kernel-source | 535.309.01-0+deb12u1 | http://deb.debian.org/debian "
           "bookworm/non-free amd64 Packages\n")
    assert madison_versions(out, "nvidia-kernel-source", "experimental") == ["555.58.02-4"]
    assert madison_versions(out, "nvidia-kernel-source") == ["555.58.02-4", "535.309.01-0+deb12u1"]
    assert madison_versions(out, "nvidia-kernel-source", "bookworm-backports") == []


def test_cli_refuses_an_unknown_driver_suite_in_one_line(tmp_path):
    from click.testing import CliRunner

    from nodeprep.cli import main

    res = CliRunner().invoke(main, ["build-driver", "--kernel", "6.1.0-50-amd64", "--driver-suite", "sid",
                                    "--cache", str(tmp_path / "c"), "--store", str(tmp_path / "s")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.splitlines()[0].startswith(
        "error: --driver-suite: 'sid' is not a driver suite of debian-12")
    assert not (tmp_path / "c").exists()


def test_a_build_resolves_its_os_once():
    """The build pipeline passes the TargetOS of the request (`BuildRequest.target`, resolved where the
    request is made) and never looks an OS up by name again: in builder/ only the matrix, which reads
    names from its file, calls targets.get, and the driver sources take the record too."""
    import ast
    from pathlib import Path

    package = Path(targets.__file__).resolve().parents[1]
    allowed = {"builder/matrix.py": 2, "builder/resolve.py": 1}  # the file's OSes; the default request
    found = {}
    for path in [*sorted((package / "builder").glob("*.py")), package / "sources" / "drivers.py"]:
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "targets"]
        if calls:
            found[str(path.relative_to(package))] = len(calls)
    assert found == allowed
