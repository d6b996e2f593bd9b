"""nvidia-persistenced from NVIDIA's source: the pinned archive's version (NVIDIA's real `git archive`
of the tag, from NODEPREP_NVIDIA_COMPANIONS), the refusals of build-driver (one line, exit 2, nothing
written), the version read from a binary, and what the user-space manifest records. No GPU involved.
The real build in the Debian 12 build root: tests/slow/builder/test_persistenced_build.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.artifact import Manifest, input_digest
from nodeprep.builder import persistenced, userspace
from nodeprep.builder.persistenced import _dep_names, embedded_version
from nodeprep.errors import InputError
from tests.support import companions
from tests.support.clirunner import invoke

PD_URL = "http://127.0.0.1:9/nvidia-persistenced-535.309.01.tar.gz"
SHA = "ab" * 32


def one_error_line(res) -> str:  # type: ignore[no-untyped-def]
    lines = res.stderr.strip().splitlines()
    assert lines and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--persistenced-sha256", SHA], "error: --persistenced-sha256 is only used with --persistenced-source"),
    (["--persistenced-source", PD_URL],
     "error: --persistenced-source needs --persistenced-sha256 (the archive's sha256)"),
    (["--persistenced-source", PD_URL, "--persistenced-sha256", "xyz"],
     "error: --persistenced-sha256: 'xyz' is not a sha256 hex digest (64 hex digits)"),
    (["--persistenced-source", PD_URL, "--persistenced-sha256", SHA, "--no-userspace"],
     "error: --persistenced-source goes into the user-space artifact: not with --no-userspace"),
    (["--persistenced-source", PD_URL, "--persistenced-sha256", SHA,
      "--runfile", "http://127.0.0.1:9/NVIDIA-Linux-x86_64-535.309.01.run", "--sha256", "cd" * 32],
     "error: --persistenced-source: not with --runfile (the installer's own nvidia-persistenced is the "
     "driver's version)"),
    (["--persistenced-source", PD_URL, "--persistenced-sha256", SHA, "--builder", "host"],
     "error: --persistenced-source: built with the target OS's toolchain in the chroot build root, not "
     "with --builder host"),
    # the name carries the version: refused before anything is downloaded (port 9 answers nothing)
    (["--persistenced-source", PD_URL, "--persistenced-sha256", SHA, "--driver", "580.142"],
     "error: --persistenced-source: nvidia-persistenced-535.309.01.tar.gz is nvidia-persistenced "
     "535.309.01, the driver is 580.142: persistenced must be the driver's exact version"),
])
def test_bad_persistenced_input(tmp_path: Path, args: list[str], message: str) -> None:
    store, cache = tmp_path / "store", tmp_path / "cache"
    res = invoke("build-driver", "--store", str(store), "--cache", str(cache), "--no-smoke-test", *args)
    assert res.exit_code == 2, res.output
    assert one_error_line(res) == message
    assert not store.exists()


def _archive(name: str) -> Path:
    found = companions.archive(name)
    if isinstance(found, str):
        pytest.skip(found)
    return found


def test_the_archives_version_is_its_tags_and_a_wrong_one_is_refused() -> None:
    """NVIDIA's archives (git archive of the tags): the version is the top directory's and version.mk's;
    the 555 source for the 535 driver is one line naming both."""
    assert persistenced.source_version(_archive("nvidia-persistenced-535.309.01.tar.gz")) == "535.309.01"
    other = _archive("nvidia-persistenced-555.58.02.tar.gz")
    assert persistenced.source_version(other) == "555.58.02"
    with pytest.raises(InputError) as e:
        persistenced.check_version(persistenced.source_version(other), "535.309.01", other.name)
    assert str(e.value) == ("--persistenced-source: nvidia-persistenced-555.58.02.tar.gz is "
                            "nvidia-persistenced 555.58.02, the driver is 535.309.01: persistenced must be "
                            "the driver's exact version")


def test_the_version_is_read_from_the_binarys_own_version_line() -> None:
    data = b"\x7fELF...\x00nvidia-persistenced:  version 535.309.01\x00Print the utility version\x00"
    assert embedded_version(data) == "535.309.01"
    assert embedded_version(b"\x00nvidia-persistenced:  version 535.309.01\x00"
                            b"\x00nvidia-persistenced:  version 555.58.02\x00") is None  # two: not one
    assert embedded_version(b"\x00535.309.01\x00") is None


def test_depends_are_read_as_alternatives() -> None:
    assert _dep_names("libc6 (>= 2.34)") == [["libc6"]]
    assert _dep_names("libtirpc3 (= 1.3.3+ds-1), libgssapi-krb5-2 | libkrb5-dev") == [
        ["libtirpc3"], ["libgssapi-krb5-2", "libkrb5-dev"]]


def _manifest(persistenced_record: dict[str, object], params: dict[str, object] | None) -> Manifest:
    inputs = {"libcuda1_535.309.01-0+deb12u1_amd64.deb": "00" * 32}
    return Manifest(kind="userspace", driver_version="535.309.01", arch="amd64", os="debian-12",
                    input_digest=input_digest(inputs, userspace.digest_params("535.309.01", "amd64", params)),
                    inputs=inputs, extra={"persistenced": persistenced_record})


def test_debians_mismatched_persistenced_is_one_warning_line() -> None:
    m = _manifest({"version": "535.171.04", "from": "debian",
                   "package": "nvidia-persistenced=535.171.04-1~deb12u1"}, None)
    assert userspace.persistenced_warning(m) == (
        "nvidia-persistenced 535.171.04 (Debian's nvidia-persistenced=535.171.04-1~deb12u1) is not the "
        "driver's 535.309.01: kept as it is; --persistenced-source builds it from NVIDIA's source at the "
        "driver's version")
    assert userspace.is_current(m)


def test_a_user_space_with_persistenced_from_source_is_current_by_its_record() -> None:
    params = {"format": persistenced.FORMAT, "version": "535.309.01", "build_root": "e7874b025d303056",
              "packages_sha256": "11" * 32}
    m = _manifest({"from": "source", "source": "nvidia-persistenced-535.309.01.tar.gz", "sha256": SHA,
                   **params}, params)
    assert userspace.persistenced_warning(m) is None and userspace.is_current(m)
    older = _manifest({"from": "source", **params, "format": persistenced.FORMAT - 1},
                      {**params, "format": persistenced.FORMAT - 1})
    assert not userspace.is_current(older)  # made by an older build procedure: rebuilt
