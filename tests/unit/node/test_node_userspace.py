"""Package selection for the user-space artifact.

Stand-in at the Debian archive boundary: RECORDED holds the versions the real bookworm archive
(main, updates, security; contrib non-free non-free-firmware) served for these names on 2026-11-22,
as `apt-cache madison` printed them. The real archive is exercised by tests/slow/node.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from nodeprep.builder.userspace import layout_payload, pick_helper, resolve_packages, upstream_version
from nodeprep.errors import ArtifactError, InputError

M = ["535.309.01-0+deb12u1", "535.261.03-1"]
T535 = ["535.216.03-3~deb12u1"]
T = ["525.147.05-15~deb12u1"]
RECORDED: dict[str, list[str]] = {
    **{
        p: M
        for p in (
            "libcuda1",
            "libnvidia-ml1",
            "nvidia-smi",
            "libnvidia-ptxjitcompiler1",
            "libnvidia-nvvm4",
            "libnvidia-cfg1",
            "libnvidia-pkcs11-openssl3",
            "nvidia-cuda-mps",
            "firmware-nvidia-gsp",
        )
    },
    **{
        f"libnvidia-tesla-535-{r}": T535
        for r in ("cuda1", "ml1", "ptxjitcompiler1", "nvvm4", "cfg1", "pkcs11-openssl3")
    },
    "nvidia-tesla-535-smi": T535,
    "firmware-nvidia-tesla-535-gsp": T535,
    **{f"libnvidia-tesla-{r}": T for r in ("cuda1", "ml1", "ptxjitcompiler1", "nvvm4", "cfg1")},
    "nvidia-tesla-smi": T,
    "firmware-nvidia-tesla-gsp": T,
    "nvidia-modprobe": ["535.309.01-0+deb12u1", "535.161.07-1~deb12u1"],
    "nvidia-persistenced": ["535.171.04-1~deb12u1"],
}


class RecordedArchive:
    def versions(self, package: str) -> list[str]:
        return list(RECORDED.get(package, []))


def test_mainline() -> None:
    chosen = resolve_packages(RecordedArchive(), "535.309.01")  # type: ignore[arg-type]
    assert chosen["cuda"] == ("libcuda1", "535.309.01-0+deb12u1")
    assert chosen["mps"] == ("nvidia-cuda-mps", "535.309.01-0+deb12u1")
    assert chosen["nvidia-modprobe"] == ("nvidia-modprobe", "535.309.01-0+deb12u1")
    assert chosen["nvidia-persistenced"] == ("nvidia-persistenced", "535.171.04-1~deb12u1")


def test_tesla_535() -> None:
    chosen = resolve_packages(RecordedArchive(), "535.216.03")  # type: ignore[arg-type]
    assert chosen["smi"] == ("nvidia-tesla-535-smi", "535.216.03-3~deb12u1")
    assert chosen["gsp"] == ("firmware-nvidia-tesla-535-gsp", "535.216.03-3~deb12u1")
    assert "mps" not in chosen  # the tesla-535 family has no MPS package
    # newest helper of the branch not newer than the driver
    assert chosen["nvidia-modprobe"] == ("nvidia-modprobe", "535.161.07-1~deb12u1")


def test_tesla_525() -> None:
    chosen = resolve_packages(RecordedArchive(), "525.147.05")  # type: ignore[arg-type]
    assert chosen["cuda"] == ("libnvidia-tesla-cuda1", "525.147.05-15~deb12u1")
    assert chosen["nvml"] == ("libnvidia-tesla-ml1", "525.147.05-15~deb12u1")


def test_unknown_version_lists_what_exists() -> None:
    with pytest.raises(InputError) as e:
        resolve_packages(RecordedArchive(), "535.999.01")  # type: ignore[arg-type]
    assert "535.309.01, 535.261.03, 535.216.03, 525.147.05" in str(e.value)


def test_pick_helper() -> None:
    assert pick_helper([], "535.1.01") is None
    assert pick_helper(["550.54.14-1", "535.161.07-1"], "535.216.03") == "535.161.07-1"
    assert pick_helper(["535.309.01-1", "535.261.03-1"], "535.216.03") == "535.261.03-1"  # oldest newer
    assert pick_helper(["535.309.01-1"], "525.147.05") == "535.309.01-1"  # another branch: newest
    assert upstream_version("1:535.309.01-0+deb12u1") == "535.309.01"


def test_layout_takes_elf_files_and_soname_links(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    lib = tree / "usr/lib/x86_64-linux-gnu/nvidia/current"
    lib.mkdir(parents=True)
    elf = b"\x7fELF" + b"\0" * 60
    (lib / "libcuda.so.535.309.01").write_bytes(elf)
    (lib / "libnvidia-ml.so.535.309.01").write_bytes(elf)
    (lib / "libcuda.so.1").symlink_to("libcuda.so.535.309.01")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")  # development link: not taken
    (tree / "usr/bin").mkdir(parents=True)
    (tree / "usr/bin/nvidia-smi").write_text("#!/bin/sh\nexec ...\n")  # a wrapper script: not taken
    (tree / "usr/lib/nvidia/current").mkdir(parents=True)
    (tree / "usr/lib/nvidia/current/nvidia-smi").write_bytes(elf)
    fw = tree / "lib/firmware/nvidia/535.309.01"
    fw.mkdir(parents=True)
    (fw / "gsp_ga10x.bin").write_bytes(b"fw")
    # nvidia-driver's supported-GPU list (the real one of 535.309.01) goes to share/, decompressed
    (tree / "usr/share/doc/nvidia-driver").mkdir(parents=True)
    real_list = Path(__file__).resolve().parents[1] / "data" / "supported-gpus" / "535.309.01.json.gz"
    shutil.copyfile(real_list, tree / "usr/share/doc/nvidia-driver/supported-gpus.json.gz")
    out = layout_payload(tree, tmp_path / "p", "535.309.01", "amd64")
    assert out == {
        "lib64": ["libcuda.so.535.309.01", "libnvidia-ml.so.535.309.01", "libcuda.so.1"],
        "bin": ["nvidia-smi"],
        "firmware": ["nvidia/535.309.01/gsp_ga10x.bin"],
        "share": ["supported-gpus.json"],
    }
    assert (tmp_path / "p/share/supported-gpus.json").read_bytes() == gzip.decompress(real_list.read_bytes())
    assert (tmp_path / "p/bin/nvidia-smi").read_bytes() == elf
    with pytest.raises(ArtifactError, match="libnvidia-ml.so.535.216.03 not found|libcuda.so.535.216.03"):
        layout_payload(tree, tmp_path / "q", "535.216.03", "amd64")
