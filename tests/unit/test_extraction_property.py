"""Property-based tests of artifact extraction (Hypothesis): generated hostile archives.

Strategies build member sequences from link chains, links to links, directories later replaced by
links (names are drawn from a small pool, so reuse is frequent), duplicate names, case variants
(`a`/`A`, `lib`/`Lib`), over-long names and components, `.`/`..`/absolute/empty link targets, hard
links, FIFOs and setuid modes. Each sequence becomes a real `.tar.zst` with a manifest listing every
file and link with its real sha256 (tests/support/rawartifact.py), extracted into `sandbox/d/…/dest`
(absolute link targets point into the sandbox, and dest is nested deeper than any relative escape
the strategies can express, so a broken rule shows as a change in the sandbox, never as a write to
the real system). Asserted:

- nothing outside `dest` changed (the sandbox is snapshotted before and after, links not followed);
- after a successful extract `dest` holds exactly the manifest's files (sha256 and mode checked)
  and links (target text as listed, resolving inside `dest`), plus their parent directories;
- `verify` finds a problem exactly when `extract` refuses.

How it runs: `test_extraction_rules_fixed_seed` is derandomized (the same examples on every run:
the CI gate); `test_extraction_rules_random` draws new examples each run, bounded by max_examples
so it stays well under 30 s on the 2-core CI machine. The profile is picked with
NODEPREP_HYPOTHESIS_PROFILE (tests/conftest.py): `ci` (default; 200 examples each) or `long`
(5000, for a local soak). A failure prints the minimal example and a `@reproduce_failure` blob.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nodeprep import artifact
from nodeprep.cli import main
from nodeprep.errors import ArtifactError, NodeprepError
from tests.support import rawartifact as ra

DEPTH = 24  # dest lies this deep in the sandbox: deeper than any escape the strategies can express
OUT = "@OUT@"  # replaced by the sandbox's `outside` directory at run time
SHORT = ["a", "A", "b", "p", "lib", "Lib"]
ODD = ["manifest.json", "x" * 255, "y" * 256]  # reserved name, longest component, one byte over


def weighted(**choices: int) -> st.SearchStrategy[str]:
    """One of the keyword names, each as likely as its weight (0: never)."""
    return st.sampled_from([k for k, w in choices.items() for _ in range(w)])


@st.composite
def components(draw: st.DrawFn, odd: int) -> str:
    return draw(st.sampled_from(ODD) if odd and draw(st.integers(0, 40)) == 17 else st.sampled_from(SHORT))


@st.composite
def member_names(draw: st.DrawFn, pool: list[str], odd: int) -> str:
    how = draw(weighted(new=4, reuse=3, below=5, long=odd) if pool else weighted(new=20, long=odd))
    if how == "reuse":  # duplicates, directories later replaced by links, links later written through
        return draw(st.sampled_from(pool))
    if how == "below":
        return draw(st.sampled_from(pool)) + "/" + draw(components(odd))
    if how == "long":  # over PATH_MAX in total, or just under it
        width = draw(st.sampled_from([190, 250]))
        return "/".join(c * width for c in "abcdefghijklmnopqrstu"[: draw(st.integers(15, 21))])
    depth = draw(st.integers(1, 4))
    return "/".join(draw(components(odd)) for _ in range(depth))


@st.composite
def link_targets(draw: st.DrawFn, name: str, pool: list[str], odd: int) -> str:
    depth = name.count("/")
    how = draw(weighted(member=10 if pool else 0, updown=10, escape=odd, odd=odd, absolute=odd))
    if how == "member":  # link chains and links to links (the target may itself be a link)
        rel = os.path.relpath(draw(st.sampled_from(pool)), os.path.dirname(name) or ".")
        if set(rel.split("/")) <= {".", ".."}:  # an ancestor of the link: mostly go one step down
            rel += "/" + draw(st.sampled_from(SHORT)) if draw(weighted(down=4, keep=odd)) == "down" else ""
        return rel
    if how == "absolute":
        return OUT + "/" + draw(st.sampled_from(["x", "p", "a/b"]))
    if how == "odd":
        return draw(st.sampled_from([".", "..", "", "./a", "a/../..", "a//b", "a/", "../" * (depth + 1),
                                     "/", "p/../../..", "x" * 256]))
    up = draw(st.integers(0, depth)) if how == "updown" else draw(st.integers(depth + 1, depth + 3))
    down = draw(st.lists(st.sampled_from(SHORT), min_size=1, max_size=3))  # escapes stay in the sandbox
    return "/".join([".."] * up + down)


@st.composite
def member_lists(draw: st.DrawFn) -> list[ra.M]:
    """Half of the sequences use only plain names, kinds and targets (their hostility, if any, is in
    how members combine); the other half also draws the odd ones, each about one time in twenty."""
    odd = draw(st.sampled_from([0, 1]))
    members: list[ra.M] = []
    pool: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        name = draw(member_names(pool, odd))
        kind = draw(weighted(file=6, dir=3, link=8, hard=odd, fifo=odd))
        if kind == "file":
            mode = draw(weighted(**{"644": 10, "755": 10, "4755": odd}))
            members.append(ra.M(name, "file", data=draw(st.binary(max_size=64)), mode=int(mode, 8)))
        elif kind == "dir":  # usually with a file below it: a directory must lead to a manifest entry
            members.append(ra.directory(name))
            if draw(weighted(below=3, alone=1)) == "below":
                members.append(ra.file(name + "/" + draw(st.sampled_from(SHORT)), b"below"))
        elif kind == "link":
            members.append(ra.link(name, draw(link_targets(name, pool, odd))))
        else:
            members.append(ra.M(name, kind, target=draw(st.sampled_from(pool or ["a"]))))
        pool.append(name)
    return members


@st.composite
def self_loops(draw: st.DrawFn) -> list[ra.M]:
    """The issue's archive and its variations: `p -> .` (or another link back up), a link reached
    through it whose target climbs more levels than it really is deep, then a file written at the
    link's real location (plus some other members around)."""
    loop = draw(st.sampled_from(["p", "lib"]))
    n = draw(st.integers(1, 6))
    k = draw(st.integers(1, n + 3))
    name = draw(st.sampled_from(["w", "a/w"]))
    deep = "/".join([loop] * n + [name])
    seq = [ra.link(loop, draw(st.sampled_from([".", "./", loop + "/.."]))),
           ra.link(deep, "/".join([".."] * k + ["x"])),
           ra.file(name, b"pwned\n")]
    extra = draw(member_lists())
    at = draw(st.integers(0, len(extra)))
    return extra[:at] + seq + extra[at:]


def snapshot(top: Path, skip: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (mode, size, sha256 of a file / text of a link) for everything under `top` except
    `skip`; links are not followed."""
    out: dict[str, tuple[int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            st_ = p.lstat()
            body = (os.readlink(p) if stat.S_ISLNK(st_.st_mode)
                    else hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st_.st_mode) else "")
            out[str(p.relative_to(top))] = (st_.st_mode, st_.st_size, body)
    return out


def _entries(dest: Path) -> Iterator[tuple[str, os.stat_result, int, str]]:
    """(path relative to dest, lstat, its directory's fd, its name) of everything under `dest`, by
    directory fds: an accepted name may be close to PATH_MAX, so dest's absolute path joined to it
    can be longer than the kernel takes."""
    for dirpath, dirnames, filenames, dirfd in os.fwalk(dest):
        for n in dirnames + filenames:
            rel = os.path.relpath(os.path.join(dirpath, n), dest)
            yield rel, os.stat(n, dir_fd=dirfd, follow_symlinks=False), dirfd, n


def _read(dirfd: int, name: str) -> bytes:
    with os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirfd), "rb") as f:
        return f.read()


def _resolves_inside(dest: Path, rel: str) -> bool:
    """Whether `rel` resolves inside `dest`, links followed one component at a time by directory fds
    as the kernel does (no absolute path is formed); past a missing component the rest is taken
    lexically, as os.path.realpath does."""
    todo = rel.split("/")
    fds = [os.open(dest, os.O_RDONLY | os.O_DIRECTORY)]
    hops = 0
    try:
        while todo:
            c = todo.pop(0)
            if c in ("", "."):
                continue
            if c == "..":
                if len(fds) == 1:
                    return False
                os.close(fds.pop())
                continue
            try:
                st_ = os.stat(c, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                level = len(fds) - 1
                for rest in [c, *todo]:
                    level += -1 if rest == ".." else 0 if rest in ("", ".") else 1
                    if level < 0:
                        return False
                return True
            if stat.S_ISLNK(st_.st_mode):
                hops += 1
                target = os.readlink(c, dir_fd=fds[-1])
                if target.startswith("/"):
                    return False
                if hops > 40:  # a loop: the kernel gives up (ELOOP), nothing is reached through it
                    return True
                todo = target.split("/") + todo
            elif stat.S_ISDIR(st_.st_mode):
                fds.append(os.open(c, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
            else:
                return True  # a file: nothing lies below it (ENOTDIR)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def check_dest(dest: Path, manifest: artifact.Manifest) -> None:
    files = manifest.files
    dirs = {"/".join(n.split("/")[:i]) for n in files for i in range(1, n.count("/") + 1)}
    found: set[str] = set()
    for rel, st_, dirfd, name in _entries(dest):
        if rel == artifact.MANIFEST:
            assert artifact.Manifest.from_json(_read(dirfd, name)) == manifest
            continue
        if stat.S_ISDIR(st_.st_mode):
            assert rel in dirs, rel
            continue
        entry = files[rel]
        found.add(rel)
        if stat.S_ISLNK(st_.st_mode):
            assert os.readlink(name, dir_fd=dirfd) == entry.target
            assert _resolves_inside(dest, rel), rel
        else:
            assert stat.S_ISREG(st_.st_mode) and entry.target is None, rel
            assert hashlib.sha256(_read(dirfd, name)).hexdigest() == entry.sha256, rel
            assert stat.S_IMODE(st_.st_mode) == entry.mode, rel
    assert found == set(files)


def _reason(message: str) -> str:
    return re.sub(r"'[^']*'", "_", message.rsplit(": ", 1)[-1])[:60]


def check_archive(members: list[ra.M]) -> None:
    with tempfile.TemporaryDirectory(prefix="nodeprep-prop-") as tmp:
        base = Path(tmp)
        sandbox = base / "sandbox"
        outside = sandbox / "outside"
        dest = sandbox.joinpath(*["d"] * DEPTH, "dest")
        for d in (outside, dest):
            d.mkdir(parents=True)
        (outside / "keep").write_bytes(b"untouched\n")
        concrete = [replace(m, target=m.target.replace(OUT, str(outside))) for m in members]
        path = ra.write(base / "art.tar.zst", concrete)
        before = snapshot(sandbox, dest)
        problems = artifact.verify(path)
        try:
            manifest = artifact.extract(path, dest)
            error = None
        except NodeprepError as e:
            error = e
        event("extracted" if error is None else "refused: " + _reason(str(error)))
        assert snapshot(sandbox, dest) == before
        assert (error is None) == (problems == []), (error, problems)
        if error is None:
            check_dest(dest, manifest)
        else:
            assert error.exit_code == 2 and "\n" not in str(error)


@settings(derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(member_lists(), self_loops()))
def test_extraction_rules_fixed_seed(members: list[ra.M]) -> None:
    check_archive(members)


@settings(derandomize=False, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(member_lists(), self_loops()))
def test_extraction_rules_random(members: list[ra.M]) -> None:
    check_archive(members)


# ---- the manifest: generated field types and values (issue 25) ---------------------------------
# Each draw starts from a valid user-space manifest and replaces some fields, and some fields of its
# file entries, with JSON values of any type. Parsing either yields a manifest whose every field has
# its declared type, or raises ArtifactError (exit 2): one line naming the field, never another
# exception; `install` of such an artifact ends the same way (exit 2, one `error:` line).

MANIFEST_KEYS = ["kind", "driver_version", "arch", "os", "input_digest", "inputs", "flavour",
                 "kernel_release", "vermagic", "compiler", "files", "extra", "format", "nodeprep_version",
                 "unknown"]
ENTRY_KEYS = ["sha256", "size", "mode", "target", "owner"]
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.sampled_from(["", "kmod", "userspace", "535.309.01", "535.309.01\n", "6.1.0-28-amd64", "../x",
                     "a\x00b", "1", "755", "e" * 64, "libnvidia-ml.so.1"]),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=6)


@st.composite
def manifest_data(draw: st.DrawFn) -> dict[str, object]:
    members = [ra.file("lib64/libnvidia-ml.so.1", b"x"), ra.link("lib64/l.so", "libnvidia-ml.so.1")]
    base = ra.manifest_for(members, kind="userspace", version="535.309.01")
    data = json.loads(base.to_json())
    for key in draw(st.lists(st.sampled_from(MANIFEST_KEYS), max_size=3, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            data.pop(key, None)
        else:
            data[key] = draw(JSON_VALUES)
    files = data.get("files")
    if isinstance(files, dict):
        for name in list(files):
            entry = files[name]
            for key in draw(st.lists(st.sampled_from(ENTRY_KEYS), max_size=2, unique=True)):
                if isinstance(entry, dict):
                    entry[key] = draw(JSON_VALUES)
    return data


def _well_typed(m: artifact.Manifest) -> bool:
    def text(v: object, optional: bool = False) -> bool:
        return (v is None and optional) or (isinstance(v, str) and v.isprintable())

    return (m.kind in ("kmod", "userspace") and text(m.driver_version) and text(m.arch) and text(m.os)
            and text(m.input_digest) and all(text(m_) for m_ in (m.flavour, m.kernel_release, m.vermagic,
                                                                  m.compiler) if m_ is not None)
            and isinstance(m.inputs, dict) and all(isinstance(v, str) for v in m.inputs.values())
            and isinstance(m.extra, dict) and type(m.format) is int and isinstance(m.nodeprep_version, str)
            and all(type(e.size) is int and type(e.mode) is int and isinstance(e.sha256, str)
                    and (e.target is None or isinstance(e.target, str)) for e in m.files.values()))


def check_manifest(data: dict[str, object]) -> None:
    raw = json.dumps(data).encode()
    try:
        m = artifact.Manifest.from_json(raw, source="art:manifest.json")
    except ArtifactError as e:
        event("refused: " + _reason(str(e)))
        assert e.exit_code == 2 and "\n" not in str(e) and str(e).startswith("art:manifest.json: ")
        return
    event("parsed")
    assert _well_typed(m), m
    assert artifact.Manifest.from_json(m.to_json()) == m


@settings(derandomize=True, deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(manifest_data())
def test_manifest_field_types_fixed_seed(data: dict[str, object]) -> None:
    check_manifest(data)


@settings(derandomize=True, deadline=None, max_examples=25,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(manifest_data())
def test_install_of_a_generated_manifest_is_one_refusal_or_none(data: dict[str, object]) -> None:
    """Through the CLI: a manifest the parser refuses makes `install` exit 2 with one `error:` line
    naming it; whatever the manifest holds, never a traceback."""
    try:
        artifact.Manifest.from_json(json.dumps(data))
        refused = False
    except ArtifactError:
        refused = True
    with tempfile.TemporaryDirectory(prefix="nodeprep-prop-") as tmp:
        store, root = Path(tmp) / "store", Path(tmp) / "root"
        store.mkdir()
        root.mkdir()
        version, kernel = "535.309.01", "6.1.0-28-amd64"
        km = [ra.file(f"modules/{kernel}/nvidia.ko", b"x")]
        kman = ra.manifest_for(km, kind="kmod", version=version, kernel=kernel)
        us = [ra.file("lib64/libnvidia-ml.so.1", b"x"), ra.link("lib64/l.so", "libnvidia-ml.so.1")]
        uman = ra.manifest_for(us, kind="userspace", version=version)
        ra.write(store / kman.name, km, kman)
        ra.write(store / uman.name, us, uman, raw_manifest=json.dumps(data).encode())
        ra.store_with(store, [(store / kman.name, kman), (store / uman.name, uman)])
        result = CliRunner().invoke(main, ["install", "--store", str(store), "--driver", version,
                                           "--kernel", kernel, "--root", str(root), "--no-load"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if refused:
        errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
        assert result.exit_code == 2 and len(errors) == 1, result.output
        assert f"{uman.name}:manifest.json" in errors[0], errors[0]


@st.composite
def safe_member_lists(draw: st.DrawFn) -> list[ra.M]:
    """Sequences the rules must accept: distinct lower-case files, links to them by relative path."""
    paths = st.lists(st.sampled_from(["a", "b", "c", "lib64"]), min_size=1, max_size=3).map("/".join)
    names = draw(st.lists(paths, min_size=1, max_size=6, unique=True))
    names = [n for n in names if not any(o.startswith(n + "/") for o in names)]
    members: list[ra.M] = [ra.file(n + ".so", draw(st.binary(max_size=32))) for n in names]
    for n in names:
        if draw(st.booleans()):
            target = os.path.relpath(draw(st.sampled_from(names)) + ".so", os.path.dirname(n) or ".")
            members.append(ra.link(n + ".1", target))
    return members


@settings(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(safe_member_lists())
def test_well_formed_archives_extract(members: list[ra.M]) -> None:
    """The rules are not so strict that they refuse what `pack` makes: files and relative links."""
    with tempfile.TemporaryDirectory(prefix="nodeprep-prop-") as tmp:
        path = ra.write(Path(tmp) / "ok.tar.zst", members)
        dest = Path(tmp) / "dest"
        dest.mkdir()
        assert artifact.verify(path) == []
        check_dest(dest, artifact.extract(path, dest))


# ---------------------------------------------------------------------------------------------
# The store index (issue 25): a store's names are data, never paths. Generated indexes whose names
# are absolute, climb with `..`, hold slashes, NUL, unicode look-alikes or are over-long, and whose
# fields have other types (numbers, booleans, null, lists, objects), missing or unknown keys: every
# parse either yields entries whose names are single file-name components equal to the name
# `artifact.artifact_name` gives their fields, or raises ArtifactError (a refused input, exit 2).

VALID_ENTRIES = {
    "kmod": {"name": "nvidia-kmod-535.309.01-proprietary-6.1.0-56-amd64.tar.zst", "kind": "kmod",
             "driver_version": "535.309.01", "arch": "amd64", "os": "debian-12", "sha256": "ab" * 32,
             "size": 1234, "input_digest": "cd" * 32, "flavour": "proprietary",
             "kernel_release": "6.1.0-56-amd64", "vermagic": "6.1.0-56-amd64 SMP preempt mod_unload "},
    "userspace": {"name": "nvidia-userspace-535.309.01-amd64.tar.zst", "kind": "userspace",
                  "driver_version": "535.309.01", "arch": "amd64", "os": "debian-12",
                  "sha256": "ef" * 32, "size": 99, "input_digest": "01" * 32},
}
STRING_FIELDS = ("name", "kind", "driver_version", "arch", "os", "sha256", "input_digest", "flavour",
                 "kernel_release", "vermagic")
SEGMENTS = ["..", ".", "", "etc", "victim", "nvidia-userspace-535.309.01-amd64.tar.zst", "x" * 256, "a\0b",
            "é", "\u202e", "ﬁle", "nvidia-kmod-535.309.01-proprietary-6.1.0-56-amd64.tar.zst"]


@st.composite
def hostile_names(draw: st.DrawFn, valid: str) -> str:
    how = draw(weighted(path=6, text=3, near=4, valid=2))
    if how == "path":  # absolute, relative with `..`/`.`, nested
        lead = draw(st.sampled_from(["", "/", "./", "../", "//"]))
        return lead + "/".join(draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=5)))
    if how == "text":
        return draw(st.text(max_size=300))
    if how == "near":  # the valid name with a prefix, suffix or one character replaced
        at = draw(st.integers(0, len(valid)))
        piece = draw(st.sampled_from(["/", "\0", "..", "../", "\u2215", "\uff0e", "x" * 250, "\n", " "]))
        return valid[:at] + piece + valid[at + draw(st.integers(0, 1)):]
    return valid


ANY_JSON = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(),
                     st.text(max_size=80), st.lists(st.integers(), max_size=2),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def index_entries(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 30)) == 0:
        return draw(ANY_JSON)  # not an object at all
    valid = VALID_ENTRIES[draw(st.sampled_from(["kmod", "userspace"]))]
    entry: dict[str, Any] = dict(valid)
    keys = st.sampled_from(["name"] * 4 + sorted(valid) + ["flavour", "kernel_release"])
    for key in draw(st.lists(keys, max_size=draw(st.sampled_from([0, 1, 1, 2, 3])))):
        how = draw(weighted(name=6 if key == "name" else 0, other=3, drop=1))
        if how == "name":
            entry[key] = draw(hostile_names(valid["name"]))
        elif how == "other":
            entry[key] = draw(ANY_JSON if key not in STRING_FIELDS or draw(st.booleans())
                              else st.text(max_size=130))
        else:
            entry.pop(key, None)
    if draw(st.integers(0, 20)) == 0:
        entry[draw(st.text(max_size=8))] = draw(ANY_JSON)  # an unknown (or known) key
    return entry


@st.composite
def index_documents(draw: st.DrawFn) -> bytes:
    how = draw(weighted(index=20, other=1, raw=1))
    if how == "raw":
        return draw(st.binary(max_size=200))
    entries = draw(st.lists(index_entries(), max_size=3))
    doc: Any = {"format": 1, "artifacts": entries}
    if how == "other":
        doc = draw(st.sampled_from([entries, {"format": draw(ANY_JSON), "artifacts": entries},
                                    {"format": 1, "artifacts": draw(ANY_JSON)}, {"format": 1}]))
    return json.dumps(doc).encode()


def check_index(raw: bytes) -> None:
    try:
        entries = artifact.parse_index(raw, source="index.json")
    except ArtifactError as e:
        assert e.exit_code == 2 and str(e).startswith("index.json: ") and "\n" not in str(e)
        event("refused")
        return
    event(f"accepted {len(entries)}")
    for e in entries:
        for key in STRING_FIELDS:
            value = getattr(e, key)
            optional = key in ("flavour", "kernel_release", "vermagic")
            assert isinstance(value, str) or (value is None and optional)
        assert type(e.size) is int and e.size >= 0
        assert e.name == artifact.artifact_name(e.kind, e.driver_version, arch=e.arch, flavour=e.flavour,
                                                kernel_release=e.kernel_release)
        assert e.name not in (".", "..") and "/" not in e.name and "\0" not in e.name
        assert 0 < len(e.name.encode()) <= 255 and not e.name.startswith(".")
        assert (Path("/cache") / e.name).parent == Path("/cache")
        assert artifact.file_name(e.name) == e.name
    assert len({e.name for e in entries}) == len(entries)


@settings(derandomize=True, deadline=None)
@given(index_documents())
def test_index_names_and_types_fixed_seed(raw: bytes) -> None:
    check_index(raw)


@settings(derandomize=False, deadline=None, print_blob=True)
@given(index_documents())
def test_index_names_and_types_random(raw: bytes) -> None:
    check_index(raw)


def test_index_accepts_what_the_store_writes() -> None:
    """Not so strict that it refuses what LocalStore and the registry publish write."""
    entries = [artifact.IndexEntry(**e) for e in VALID_ENTRIES.values()]
    assert artifact.parse_index(artifact.render_index(entries), source="index.json") == sorted(
        entries, key=lambda e: e.name)
