"""The rules an artifact's tar members must follow, and a writer that cannot leave its directory.

`MemberRules` is one pure state machine over the member headers in archive order; `artifact.extract`
and `artifact.verify` both feed it, so `nodeprep artifacts verify` refuses exactly what install
refuses. The rules (stricter than PEP 706's `data` filter):

- the first member is `manifest.json` (a regular file of at most MAX_MANIFEST_BYTES); every later
  member is a regular file or symlink listed in the manifest, or a directory that is an ancestor of
  a listed path; nothing else (hard links, devices, FIFOs, setuid/setgid/sticky bits) is allowed;
- names are canonical relative paths (no leading '/', no '', '.' or '..' components), at most
  PATH_MAX bytes, each component at most NAME_MAX bytes;
- no name is used twice, also not by a case variant (`Lib` after `lib`), and no member replaces an
  earlier one (an explicit directory may only follow its own implicit creation);
- no member's parent path goes through an earlier symlink or file member;
- a symlink's target is `../` repeated k times then at least one plain component, with k not above
  the depth of the link's directory, and must equal the manifest's `target`;
- a regular file's header size equals the manifest's size; the manifest's sizes are capped
  (Limits) and file modes are 0644 or 0755.

Why nothing can be written or resolved outside the destination: a member's parents are real
directories (never a link, since links cannot sit on a parent path and nothing is replaced), and
the writer (`Beneath`) enforces that again at the system-call level, opening each component with
O_NOFOLLOW relative to the previous directory fd and creating with O_EXCL / symlinkat / mkdirat.
A link's own `..` steps walk only through those real directories and stop at or below the
destination; its remaining steps only descend, and each link met while descending resolves inside
by the same argument, so every link resolves inside (or dangles, or loops: neither escapes).
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .errors import ArtifactError, StateError

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class FileEntry:
    """One file of a manifest (nodeprep.artifact.Manifest.files): what its tar member must match."""

    sha256: str
    size: int
    mode: int  # 0o755 or 0o644; symlinks: 0o777 with `target`
    target: str | None = None


PATH_MAX = 4096  # bytes of a member name or link target, including the terminating NUL
NAME_MAX = 255  # bytes of one path component
MAX_MEMBER_BYTES = 1 << 30  # one file of an artifact
MAX_TOTAL_BYTES = 4 << 30  # all files of an artifact together
MAX_MANIFEST_BYTES = 16 << 20
FILE_MODES = (0o644, 0o755)


@dataclass(frozen=True)
class Limits:
    """Size caps, checked against the manifest before anything beyond it is written."""

    member_bytes: int = MAX_MEMBER_BYTES
    total_bytes: int = MAX_TOTAL_BYTES


LIMITS = Limits()


def _encoded(text: str) -> bytes:
    return os.fsencode(text)


def name_problem(name: str) -> str | None:
    """Why `name` is not a canonical relative member name (None: it is)."""
    if not name:
        return "empty name"
    if name.startswith("/"):
        return "absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "contains '..'"
    if "" in parts or "." in parts:
        return "not a canonical path ('', '.' components)"
    if len(_encoded(name)) >= PATH_MAX:
        return f"name longer than {PATH_MAX - 1} bytes"
    if any(len(_encoded(p)) > NAME_MAX for p in parts):
        return f"a path component is longer than {NAME_MAX} bytes"
    return None


def link_problem(name: str, target: str) -> str | None:
    """Why symlink `name` -> `target` is refused (None: it resolves below the artifact's root).

    The target must be `../` * k followed by at least one plain component, k <= depth of the link's
    directory: the `..` steps then walk only through the link's own (real) parent directories."""
    if not target:
        return "empty link target"
    if target.startswith("/"):
        return f"link target {target!r} points outside the artifact (absolute)"
    if len(_encoded(target)) >= PATH_MAX:
        return f"link target longer than {PATH_MAX - 1} bytes"
    parts = target.split("/")
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    rest = parts[up:]
    if not rest or any(p in ("", ".", "..") for p in rest):
        return (f"link target {target!r} is not '../'* followed by plain components "
                "(points outside the artifact or at a directory above the link)")
    if any(len(_encoded(p)) > NAME_MAX for p in rest):
        return f"link target component longer than {NAME_MAX} bytes"
    if up > name.count("/"):
        return f"link target {target!r} points outside the artifact"
    return None


class MemberRules:
    """Feed every member header in archive order to `check`; after the first (the manifest) call
    `accept_manifest` with its parsed files. Raises ArtifactError naming the member and the rule."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self.files: Mapping[str, FileEntry] | None = None
        self.total_bytes = 0
        self._first_seen = False
        self._dirs: set[str] = set()
        # casefolded path -> (exact path, kind): "implicit" | "dir" | "file" | "link"
        self._seen: dict[str, tuple[str, str]] = {}
        self._done: set[str] = set()

    @property
    def started(self) -> bool:
        """Whether the first member (the manifest's header) was checked."""
        return self._first_seen

    def accept_manifest(self, files: Mapping[str, FileEntry]) -> None:
        """Check the manifest's paths, modes and sizes against the rules and the caps."""
        total = 0
        for name, entry in sorted(files.items()):
            problem = name_problem(name) or ("reserved name" if name == MANIFEST else None)
            if problem is None and entry.target is not None:
                problem = link_problem(name, entry.target)
            if problem is None and entry.target is None:
                if entry.mode not in FILE_MODES:
                    problem = f"mode {entry.mode:o} (only 644 and 755 are allowed)"
                elif not 0 <= entry.size <= self.limits.member_bytes:
                    problem = (f"size {entry.size} bytes is over the cap of {self.limits.member_bytes} "
                               "bytes per file")
            if problem:
                raise ArtifactError(f"{MANIFEST}: unsafe member {name!r}: {problem}")
            total += entry.size if entry.target is None else 0
        if total > self.limits.total_bytes:
            raise ArtifactError(f"{MANIFEST}: files total {total} bytes, over the cap of "
                                f"{self.limits.total_bytes} bytes")
        self.files = files
        self.total_bytes = total
        self._dirs = {"/".join(n.split("/")[:i]) for n in files for i in range(1, n.count("/") + 1)}
        self._seen[MANIFEST] = (MANIFEST, "file")

    def check(self, member: tarfile.TarInfo) -> str:
        """The member's canonical name, or ArtifactError when it breaks a rule."""
        if not self._first_seen:
            if member.name != MANIFEST or not member.isreg():
                raise ArtifactError(f"first member is {member.name!r}, not {MANIFEST}")
            if member.size > MAX_MANIFEST_BYTES:
                raise ArtifactError(f"{MANIFEST} is {member.size} bytes (at most {MAX_MANIFEST_BYTES})")
            self._first_seen = True
            return MANIFEST
        if self.files is None:
            raise ArtifactError(f"{MANIFEST} was not accepted")
        raw = member.name
        name = raw[:-1] if member.isdir() and raw.endswith("/") else raw
        why = name_problem(name) or _type_problem(member)
        if why is None and member.issym():
            why = link_problem(name, member.linkname)
        if why is None:
            why = self._manifest_problem(name, member)
        if why is None:
            why = self._place_problem(name, member)
        if why is not None:
            raise ArtifactError(f"unsafe member {raw!r}: {why}")
        parts = name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            self._seen.setdefault(prefix.casefold(), (prefix, "implicit"))
        kind = "dir" if member.isdir() else "link" if member.issym() else "file"
        self._seen[name.casefold()] = (name, kind)
        if kind != "dir":
            self._done.add(name)
        return name

    def _manifest_problem(self, name: str, member: tarfile.TarInfo) -> str | None:
        assert self.files is not None
        if member.isdir():
            return None if name in self._dirs else "directory not on the path of any manifest entry"
        entry = self.files.get(name)
        if entry is None:
            return "not listed in the manifest"
        if member.issym():
            if entry.target != member.linkname:
                return f"link target {member.linkname!r} != manifest {entry.target!r}"
        elif entry.target is not None:
            return f"a regular file, the manifest lists a link to {entry.target!r}"
        elif member.size != entry.size:
            return f"tar header size {member.size} != manifest size {entry.size}"
        return None

    def _place_problem(self, name: str, member: tarfile.TarInfo) -> str | None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            seen = self._seen.get(prefix.casefold())
            if seen is None:
                continue
            exact, kind = seen
            if exact != prefix:
                return f"{prefix!r} is a case variant of the earlier {exact!r}"
            if kind in ("link", "file"):
                return f"its path goes through the earlier {kind} member {prefix!r}"
        seen = self._seen.get(name.casefold())
        if seen is None:
            return None
        exact, kind = seen
        if exact != name:
            return f"case variant of the earlier {exact!r}"
        if member.isdir() and kind == "implicit":
            return None
        if kind in ("dir", "implicit") and not member.isdir():
            return "would replace a directory"
        return f"duplicate name (would replace the earlier {kind})"

    def mode(self, name: str) -> int:
        assert self.files is not None
        return self.files[name].mode

    def checksum_problem(self, name: str, digest: str) -> str | None:
        assert self.files is not None
        want = self.files[name].sha256
        if digest == want:
            return None
        return f"{name}: sha256 {digest} does not match the manifest ({want})"

    def missing(self) -> list[str]:
        """Manifest entries no member provided (call after the last member)."""
        return sorted(set(self.files or {}) - self._done)


def _type_problem(member: tarfile.TarInfo) -> str | None:
    if member.ischr() or member.isblk() or member.isfifo():
        return "device node or FIFO"
    if member.islnk():
        return "hard link"
    if member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        return f"setuid/setgid/sticky mode {member.mode:o}"
    if not (member.isreg() or member.isdir() or member.issym()):
        return "unsupported type"
    return None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Beneath:
    """Writes entries beneath an empty directory without ever following a symlink: every parent
    component is opened with O_NOFOLLOW relative to the previous directory fd (an openat walk),
    files are created O_EXCL|O_NOFOLLOW, links with symlinkat, directories with mkdirat; nothing
    existing is replaced. A context manager holding the destination's fd."""

    def __init__(self, dest: Path) -> None:
        self.dest = Path(dest)
        self._fd = -1

    def __enter__(self) -> Beneath:
        try:
            self._fd = os.open(self.dest, _DIR_FLAGS)
        except OSError as e:
            raise StateError(f"{self.dest}: cannot open the destination directory ({e.strerror})") from None
        if os.listdir(self._fd):
            os.close(self._fd)
            raise StateError(f"{self.dest}: the destination directory is not empty")
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        os.close(self._fd)

    def check_space(self, needed: int, *, what: str) -> None:
        st = os.fstatvfs(self._fd)
        free = st.f_bavail * st.f_frsize
        if needed > free:
            raise StateError(f"{what}: needs {needed} bytes, {self.dest} has {free} bytes free")

    def _parent(self, name: str) -> tuple[int, str]:
        parts = name.split("/")
        fd = os.dup(self._fd)
        for comp in parts[:-1]:
            try:
                try:
                    os.mkdir(comp, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                os.close(fd)
                raise ArtifactError(f"unsafe member {name!r}: {comp!r} on its path is not a plain "
                                    f"directory ({e.strerror})") from None
            os.close(fd)
            fd = nfd
        return fd, parts[-1]

    def open_file(self, name: str) -> int:
        """A read-only fd of `name`, a file written before (opened beneath dest, nothing followed)."""
        fd, leaf = self._parent(name)
        try:
            return os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)

    def _refused(self, name: str, e: OSError) -> ArtifactError:
        return ArtifactError(f"unsafe member {name!r}: cannot create it without replacing or following "
                             f"an existing entry ({e.strerror})")

    def make_dir(self, name: str) -> None:
        fd, leaf = self._parent(name)
        try:
            try:
                os.mkdir(leaf, 0o755, dir_fd=fd)
            except FileExistsError:
                st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    raise ArtifactError(f"unsafe member {name!r}: would replace a non-directory") from None
        except OSError as e:
            raise self._refused(name, e) from None
        finally:
            os.close(fd)

    def make_link(self, name: str, target: str) -> None:
        fd, leaf = self._parent(name)
        try:
            os.symlink(target, leaf, dir_fd=fd)
        except OSError as e:
            raise self._refused(name, e) from None
        finally:
            os.close(fd)

    def write_file(self, name: str, chunks: Iterable[bytes], mode: int) -> None:
        fd, leaf = self._parent(name)
        try:
            out = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o600, dir_fd=fd)
        except OSError as e:
            raise self._refused(name, e) from None
        finally:
            os.close(fd)
        with os.fdopen(out, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            os.fchmod(f.fileno(), mode)
