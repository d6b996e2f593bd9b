"""CONFIG_CC_VERSION_TEXT parsing and the compiler match rule."""

from __future__ import annotations

import pytest

from nodeprep.build import cc
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
