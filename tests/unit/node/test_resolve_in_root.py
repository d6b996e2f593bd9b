"""Property test of nodeprep.rootpath.resolve_in_root against the kernel's own openat2(2) with
RESOLVE_IN_ROOT (called through ctypes; skipped where the kernel lacks it).

Hypothesis builds random trees under `sandbox/root`: directories, files and links drawn from a small
name pool, with absolute, relative, `..`, `.`, `/`, self and mutual (loop) targets, and targets
naming the sandbox's `outside` directory by its host path. For random paths (absolute or relative,
with `.`, `..` and doubled slashes) it asserts: the result never leaves the root; where the kernel
resolves the path, resolve_in_root names the same file (the fd's /proc/self/fd link), with and
without following the last component; where the kernel refuses, resolve_in_root refuses with the
same errno, or (a missing component) names a path that does not exist.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeprep.rootpath import resolve_in_root

NAMES = ["a", "b", "opt", "lib"]
RESOLVE_IN_ROOT = 0x10
SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def kernel_resolve(root_fd: int, path: str, *, follow_last: bool) -> str | int:
    """What openat2(root_fd, path, O_PATH, RESOLVE_IN_ROOT) opens (its /proc/self/fd link), or errno."""
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow_last else os.O_NOFOLLOW)
    how = OpenHow(flags, 0, RESOLVE_IN_ROOT)
    fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(root_fd), ctypes.c_char_p(path.encode()),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        return ctypes.get_errno()
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def _has_openat2() -> bool:
    if SYS_OPENAT2 is None:
        return False
    fd = os.open("/", os.O_PATH)
    try:
        return kernel_resolve(fd, ".", follow_last=True) == "/"
    finally:
        os.close(fd)


pytestmark = pytest.mark.skipif(not _has_openat2(), reason="this kernel has no openat2(2)")

relpaths = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join)
targets = st.one_of(
    relpaths,
    relpaths.map(lambda p: "/" + p),
    st.tuples(st.integers(1, 4), relpaths).map(lambda t: "../" * t[0] + t[1]),
    st.sampled_from(["/", ".", "..", "../..", "/..", "./a", "a/../b", "@OUT@", "@OUT@/a", "a/"]),
)
entries = st.lists(st.tuples(relpaths, st.sampled_from(["dir", "file", "link", "link"]), targets),
                   min_size=1, max_size=14)
queries = st.lists(
    st.tuples(st.booleans(), st.lists(st.sampled_from([*NAMES, "..", ".", ""]), min_size=1, max_size=6)),
    min_size=1, max_size=12,
).map(lambda qs: [("/" if lead else "") + "/".join(parts) or "." for lead, parts in qs])


def _make(root: Path, rel: str, kind: str, target: str, outside: Path) -> None:
    """Create `rel` under `root` only through real directories (never through a link)."""
    parts = rel.split("/")
    here = root
    for name in parts[:-1]:
        here = here / name
        if not os.path.lexists(here):
            here.mkdir()
        elif here.is_symlink() or not here.is_dir():
            return
    path = here / parts[-1]
    if os.path.lexists(path):
        return
    if kind == "dir":
        path.mkdir()
    elif kind == "file":
        path.write_text("x")
    else:
        os.symlink(target.replace("@OUT@", str(outside)), path)


def _snapshot(top: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                out[p] = os.readlink(p)
            else:
                out[p] = "dir" if os.path.isdir(p) else Path(p).read_text()
    return out


def _check(tree: list[tuple[str, str, str]], paths: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(os.path.realpath(tmp))
        root, outside = sandbox / "root", sandbox / "outside"
        root.mkdir()
        (outside / "a").mkdir(parents=True)
        (outside / "secret").write_text("host")
        for rel, kind, target in tree:
            _make(root, rel, kind, target, outside)
        before = _snapshot(sandbox)
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        try:
            for path in paths:
                for follow in (True, False):
                    _agree(root, root_fd, path, follow)
        finally:
            os.close(root_fd)
        assert _snapshot(sandbox) == before


def _agree(root: Path, root_fd: int, path: str, follow: bool) -> None:
    want = kernel_resolve(root_fd, path, follow_last=follow)
    try:
        got: str | int = os.path.join(root, *resolve_in_root(str(root), path, follow_last=follow))
    except OSError as e:
        got = e.errno
    if isinstance(got, str):
        assert got == str(root) or got.startswith(f"{root}/"), (path, got)
    where = (path, follow, want, got)
    if isinstance(want, str):
        assert got == want, where
    elif want == errno.ENOENT and isinstance(got, str):
        assert not os.path.lexists(got), where
    else:
        assert got == want, where


@settings(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries, queries)
def test_resolve_in_root_matches_openat2(tree: list[tuple[str, str, str]], paths: list[str]) -> None:
    _check(tree, paths)


def test_links_out_of_the_root_resolve_inside_it(tmp_path: Path) -> None:
    """The cases of issue #25 by hand: absolute, `../../..` and looping links."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "opt").symlink_to(tmp_path / "host-opt")
    (root / "etc" / "systemd").symlink_to("../../../host-etc")
    (root / "loop").symlink_to("loop")
    assert resolve_in_root(str(root), "/opt/nvidia/current", follow_last=False) == \
        [*str(tmp_path / "host-opt").strip("/").split("/"), "nvidia", "current"]
    assert resolve_in_root(str(root), "etc/systemd/system") == ["host-etc", "system"]
    with pytest.raises(OSError) as e:
        resolve_in_root(str(root), "loop/x")
    assert e.value.errno == errno.ELOOP


def test_link_hops_are_bounded_as_the_kernel_bounds_them(tmp_path: Path) -> None:
    """A chain of MAX_LINKS links resolves, one more is ELOOP, for the kernel and for us."""
    from nodeprep.rootpath import MAX_LINKS

    root = tmp_path / "root"
    root.mkdir()
    (root / "end").mkdir()
    (root / "l0").symlink_to("/end")
    for i in range(1, MAX_LINKS + 1):
        (root / f"l{i}").symlink_to(f"/l{i - 1}")
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        _agree(root, root_fd, f"l{MAX_LINKS - 1}", True)
        _agree(root, root_fd, f"l{MAX_LINKS}", True)
        assert kernel_resolve(root_fd, f"l{MAX_LINKS}", follow_last=True) == errno.ELOOP
    finally:
        os.close(root_fd)
