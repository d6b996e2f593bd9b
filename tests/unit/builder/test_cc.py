"""CONFIG_CC_VERSION_TEXT parsing and the compiler match rule."""

from __future__ import annotations

import pytest

from nodeprep.builder import cc
from nodeprep.errors import InputError

# Lines as in linux-headers-6.1.0-56-amd64's .config (Debian 12).
CONFIG = """#
# Automatically generated file; DO NOT EDIT.
# Linux/x86 6.1.192 Kernel Configuration
#
CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
CONFIG_CC_IS_GCC=y
CONFIG_GCC_VERSION=120200
"""


def test_parse_kernel_compiler():
    c = cc.kernel_compiler(CONFIG)
    assert c.text == "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
    assert (c.program, c.family, c.version, c.distro_version) == (
        "gcc-12",
        "gcc",
        "12.2.0",
        "Debian 12.2.0-14+deb12u1",
    )


def test_read_from_headers_dir(tmp_path):
    (tmp_path / ".config").write_text(CONFIG)
    assert cc.read_kernel_compiler(tmp_path).version == "12.2.0"


def test_missing_cc_text_is_input_error(tmp_path):
    (tmp_path / ".config").write_text("CONFIG_CC_IS_GCC=y\n")
    with pytest.raises(InputError, match="no CONFIG_CC_VERSION_TEXT"):
        cc.read_kernel_compiler(tmp_path)
    with pytest.raises(InputError, match="no .config"):
        cc.read_kernel_compiler(tmp_path / "nothing")


def test_gcc_version_output():
    out = "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
    assert cc.compiler_from_version_output(out).text == "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"


def test_match_and_mismatch():
    kernel = cc.kernel_compiler(CONFIG)
    assert cc.mismatch(kernel, cc.Compiler("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0")) is None
    assert cc.mismatch(kernel, cc.Compiler("gcc-12 (Debian 12.2.0-14) 12.2.0")) is None  # same upstream
    why = cc.mismatch(kernel, cc.Compiler("gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0"))
    assert why and "12.2.0" in why and "11.4.0" in why
    assert cc.mismatch(kernel, cc.Compiler("Debian clang version 14.0.6")) is not None
    assert cc.mismatch(kernel, cc.Compiler("gcc-12 (missing)")) is not None


@pytest.mark.parametrize("text,family,version", [
    ("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc", "12.2.0"),
    ("gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", "gcc", "11.4.0"),
    ("x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0", "gcc", "13.2.0"),
    ("gcc (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)", "gcc", "11.4.1"),
    ("Debian clang version 14.0.6", "clang", "14.0.6"),
    ("clang version 16.0.6 (Fedora 16.0.6-3.fc38)", "clang", "16.0.6"),
])
def test_compiler_version_of_real_banners(text: str, family: str, version: str) -> None:
    """CONFIG_CC_VERSION_TEXT values as Debian, Ubuntu, RHEL and Fedora kernels record them."""
    c = cc.Compiler(text)
    assert (c.family, c.version) == (family, version)
    rhel = cc.Compiler("gcc (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)")
    assert cc.mismatch(rhel, cc.Compiler("gcc (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)")) is None
    assert cc.mismatch(rhel, cc.Compiler("gcc (GCC) 11.5.0 20240719 (Red Hat 11.5.0-2)")) is not None
