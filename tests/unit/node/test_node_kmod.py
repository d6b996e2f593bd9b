"""Vermagic parsing and comparison."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.node.kmod import Vermagic, parse_vermagic, target_kernel, vermagic_problem
from nodeprep.node.layout import Layout

# vermagic strings as modinfo prints them for Debian 12 kernels (note the trailing space)
DEBIAN = "6.1.0-28-amd64 SMP preempt mod_unload modversions "
DEBIAN_RT = "6.1.0-28-rt-amd64 SMP preempt_rt mod_unload modversions "


def test_parse() -> None:
    v = parse_vermagic(DEBIAN)
    assert v.release == "6.1.0-28-amd64"
    assert v.flags == frozenset({"SMP", "preempt", "mod_unload", "modversions"})
    assert str(v) == "6.1.0-28-amd64 SMP mod_unload modversions preempt"
    with pytest.raises(InputError):
        parse_vermagic("   ")


def test_same_vermagic_fits() -> None:
    assert vermagic_problem(parse_vermagic(DEBIAN), parse_vermagic(DEBIAN.strip())) is None
    assert vermagic_problem(parse_vermagic(DEBIAN), "6.1.0-28-amd64") is None


def test_release_mismatch_names_both_releases() -> None:
    problem = vermagic_problem(parse_vermagic(DEBIAN), "6.1.0-29-amd64")
    assert problem is not None
    assert "6.1.0-28-amd64" in problem and "6.1.0-29-amd64" in problem and "vermagic mismatch" in problem


def test_flag_mismatch_lists_differences() -> None:
    kernel = Vermagic("6.1.0-28-amd64", frozenset({"SMP", "preempt_rt", "mod_unload", "modversions"}))
    problem = vermagic_problem(parse_vermagic(DEBIAN), kernel)
    assert problem is not None and "['preempt']" in problem and "['preempt_rt']" in problem
    assert vermagic_problem(parse_vermagic(DEBIAN_RT), parse_vermagic(DEBIAN)) is not None


def test_target_kernel_required_with_root(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--kernel: required with --root"):
        target_kernel(Layout(tmp_path), None)
    assert target_kernel(Layout(tmp_path), "6.1.0-28-amd64") == "6.1.0-28-amd64"
    with pytest.raises(InputError, match="not a kernel release"):
        target_kernel(Layout(tmp_path), "../../etc")
    import os

    assert target_kernel(Layout(Path("/")), None) == os.uname().release
