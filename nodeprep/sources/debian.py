"""Debian's archive through a private apt configuration.

Everything apt needs lives under `<cache>/apt/<os>/` (sources list, lists, package cache); the
host's apt configuration and state are never modified. The archive mirror is taken from the host's
own apt sources (so a local mirror or proxy keeps working) unless NODEPREP_DEBIAN_MIRROR /
NODEPREP_DEBIAN_SECURITY_MIRROR or the `mirror` argument name one. Packages are verified by apt
against the signed Release files and their sha256 is checked again before use.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import runner, targets
from ..digests import sha256_file
from ..errors import ChecksumError, CommandError, InputError, NetworkError, StateError
from ..targets import Archive

log = logging.getLogger(__name__)

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
COMPONENTS = "main contrib non-free non-free-firmware"
APT_TIMEOUT = 600
URI_RE = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) SHA256:(?P<sha>[0-9a-f]{64})", re.M)


def release(os_name: str, kernel: str | None = None, channel: str | None = None,
            driver_suite: str | None = None) -> Archive:
    """The archive suites of `os_name` (and of the kernel line `kernel` belongs to, or of the line
    named `channel`; with the driver suite `driver_suite`): nodeprep.targets;
    `debian-sid` is archive access only (the newest packages of a kind, e.g. containerd 2.x for the
    container-runtime tests), never a build target."""
    if os_name in ARCHIVE_ONLY:
        return ARCHIVE_ONLY[os_name]
    target = targets.get(os_name)
    if channel is None:
        return targets.archive(target, kernel, driver_suite)
    try:
        return target.archive(target.channel_named(channel), driver_suite)
    except ValueError as e:
        raise InputError(str(e)) from None


ARCHIVE_ONLY = {"debian-sid": Archive(name="debian-sid", suite="sid", suites=("sid",), security_suite=None,
                                      key="debian-sid")}


def debian_version_to_driver(version: str) -> str:
    """Upstream driver version of a Debian package version: '535.309.01-0+deb12u1' -> '535.309.01'."""
    upstream = version.split(":", 1)[-1]
    if "-" in upstream:
        upstream = upstream.rsplit("-", 1)[0]
    return upstream.split("~", 1)[0].split("+", 1)[0]


def host_mirrors(sources_dir: Path = Path("/etc/apt")) -> tuple[str | None, str | None]:
    """(archive URI, security URI) found in the host's apt sources, deb822 or one-line style."""
    uris: list[str] = []
    files = sorted((sources_dir / "sources.list.d").glob("*.sources")) + sorted(
        (sources_dir / "sources.list.d").glob("*.list")) + [sources_dir / "sources.list"]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("URIs:"):
                uris += line.split()[1:]
            elif line.startswith("deb "):
                uris += [w for w in line.split()[1:] if "://" in w][:1]
    security = next((u for u in uris if u.rstrip("/").endswith("debian-security")), None)
    archive = next((u for u in uris if u.rstrip("/").endswith("/debian")), None)
    return archive, security


def madison_versions(out: str, package: str, suite: str | None = None) -> list[str]:
    """The versions of `package` in `apt-cache madison` output (`pkg | version | URI suite/component
    arch Packages`), in its order; only those of `suite` when given."""
    seen: list[str] = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 3 or parts[0] != package or parts[1] in seen:
            continue
        where = parts[2].split()
        if suite is None or (len(where) > 1 and where[1].split("/", 1)[0] == suite):
            seen.append(parts[1])
    return seen


def parse_control(text: str) -> dict[str, str]:
    """First deb822 stanza as a dict (continuation lines joined with newlines)."""
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        if line[0] in " \t" and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


class DebianArchive:
    """Query and download packages of one Debian release with a private apt setup."""

    def __init__(self, cache_dir: Path, *, os_name: str = targets.DEFAULT, arch: str = "amd64",
                 mirror: str | None = None, security_mirror: str | None = None,
                 kernel: str | None = None, channel: str | None = None, security: bool = True,
                 driver_suite: str | None = None, read_only: bool = False) -> None:
        """`security=False` leaves the release's security suite out (its own lists directory): for
        lookups where the newest security update does not matter and the security mirror's index
        for that architecture may be unusable (a mirror in mid-sync serves a mismatched index).
        `read_only` (a --check): queries answer from the lists in the cache as they are, and nothing
        is written there (no refresh, no apt binary caches); without lists a query is StateError."""
        self.read_only = read_only
        self.release = release(os_name, kernel, channel, driver_suite)
        self.arch = arch
        self.security = security
        suffix = "" if security else "-nosecurity"
        self.dir = Path(cache_dir) / "apt" / f"{self.release.key}-{arch}{suffix}"
        self.debs = Path(cache_dir) / "debs"
        host_archive, host_security = host_mirrors()
        self.mirror = (mirror or os.environ.get("NODEPREP_DEBIAN_MIRROR") or host_archive or "").rstrip("/")
        self.security_mirror = (security_mirror or os.environ.get("NODEPREP_DEBIAN_SECURITY_MIRROR")
                                or host_security or "").rstrip("/")
        if not self.mirror:
            raise InputError("no Debian mirror configured",
                             hint="set NODEPREP_DEBIAN_MIRROR to the archive's base URL (…/debian)")

    # -- apt plumbing ----------------------------------------------------------------------------
    def _setup(self) -> None:
        for d in ("lists/partial", "archives/partial", "etc/sources.list.d", "etc/preferences.d"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        lines = [f"deb [signed-by={KEYRING}] {self.mirror} {s} {COMPONENTS}" for s in self.release.suites]
        if self.security and self.security_mirror and self.release.security_suite:
            lines.append(f"deb [signed-by={KEYRING}] {self.security_mirror} {self.release.security_suite} "
                         f"{COMPONENTS}")
        content = "\n".join(lines) + "\n"
        sources = self.dir / "etc" / "sources.list"
        if not sources.exists() or sources.read_text() != content:
            sources.write_text(content)
            (self.dir / "updated").unlink(missing_ok=True)

    def _options(self) -> list[str]:
        d = self.dir
        opts: dict[str, str | Path] = {
            "Dir::Etc::SourceList": d / "etc" / "sources.list",
            "Dir::Etc::SourceParts": d / "etc" / "sources.list.d",
            "Dir::Etc::PreferencesParts": d / "etc" / "preferences.d",
            "Dir::Etc::Preferences": d / "etc" / "preferences",
            "Dir::State": d,
            "Dir::State::Lists": d / "lists",
            "Dir::State::status": "/dev/null",
            "Dir::Cache": d,
            "Dir::Cache::archives": d / "archives",
            # apt's binary caches of the lists: without them every apt call parses ~20 MB of lists
            # (about a second each); apt regenerates them when the lists change (temp + rename).
            "Dir::Cache::pkgcache": d / "pkgcache.bin",
            "Dir::Cache::srcpkgcache": d / "srcpkgcache.bin",
            "APT::Architecture": self.arch,
            "APT::Architectures": self.arch,
            "Acquire::Retries": "3",
            "Acquire::http::Timeout": "30",
            "Acquire::Languages": "none",
            "APT::Sandbox::User": "root",
        }
        if self.read_only:
            opts |= {"Dir::Cache::pkgcache": "", "Dir::Cache::srcpkgcache": ""}
        out: list[str] = []
        for k, v in opts.items():
            out += ["-o", f"{k}={os.fspath(v)}"]
        return out

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".nodeprep.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _apt(self, tool: str, *args: str, timeout: float = APT_TIMEOUT, cwd: Path | None = None) -> str:
        return runner.run([tool, "-q", *self._options(), *args], timeout=timeout, cwd=cwd,
                          inherit_env=True, env={"LC_ALL": "C"}).stdout

    def update(self, max_age_s: float = 3600) -> None:
        """Refresh the package lists when they are older than `max_age_s` seconds (read_only: only
        check that there are lists to answer from)."""
        if self.read_only:
            if not (self.dir / "updated").is_file():
                raise StateError(f"the Debian {self.release.suite} package lists are not in the cache "
                                 f"({self.dir}): nothing to resolve from without fetching them",
                                 hint="run it once without --check, or `build-matrix --expand`")
            return
        with self._locked():
            self._setup()
            stamp = self.dir / "updated"
            if stamp.exists() and time.time() - stamp.stat().st_mtime < max_age_s:
                return
            log.info("Updating Debian %s package lists (private apt configuration)", self.release.suite)
            try:
                out = self._apt("apt-get", "update")
            except CommandError as e:
                raise NetworkError(f"Debian archive {self.mirror} unreachable: apt-get update failed"
                                   f"{' (timed out)' if e.returncode == -1 else ''}", hint=e.tail) from None
            failed = [line for line in out.splitlines() if line.startswith(("Err:", "W: Failed", "E:"))]
            if failed:
                raise NetworkError(f"Debian archive {self.mirror} unreachable: {failed[0]}")
            stamp.touch()

    # -- queries ---------------------------------------------------------------------------------
    def versions(self, package: str, suite: str | None = None) -> list[str]:
        """Every version of `package` the archive serves (only from `suite` when given), newest
        first (empty when unknown)."""
        self.update()
        return madison_versions(self._apt("apt-cache", "madison", package), package, suite)

    def packages(self, regex: str) -> list[str]:
        """Names of packages matching the POSIX regex `regex` (sorted)."""
        self.update()
        out = self._apt("apt-cache", "search", "--names-only", regex)
        return sorted({line.split(" - ", 1)[0].strip() for line in out.splitlines() if " - " in line})

    def info(self, package: str, version: str | None = None) -> dict[str, str]:
        """Control fields of `package` (newest version unless `version`)."""
        self.update()
        spec = f"{package}={version}" if version else package
        try:
            out = self._apt("apt-cache", "show", spec)
        except CommandError:
            raise InputError(f"{spec}: not served by the Debian archive") from None
        if not version:
            return parse_control(out)
        for stanza in out.split("\n\n"):
            fields = parse_control(stanza)
            if fields.get("Version") == version:
                return fields
        raise InputError(f"{spec}: not served by the Debian archive")

    # -- downloads -------------------------------------------------------------------------------
    def download(self, package: str, version: str | None = None) -> Path:
        """The .deb of `package` (newest unless `version`), cached and sha256-verified."""
        return self.download_many([(package, version)])[0]

    def download_many(
        self, specs: list[tuple[str, str | None]], progress: Callable[[int, int | None], None] | None = None
    ) -> list[Path]:
        """The .debs of `specs` ((package, version or None for the newest), in that order), cached
        and sha256-verified: one apt query for every location, one apt run fetching the missing
        files together. `progress(bytes done, total bytes)` follows apt's download status."""
        self.update()
        wanted = [f"{p}={v}" if v else p for p, v in specs]
        if not wanted:
            return []
        try:
            out = self._apt("apt-get", "--print-uris", "download", *wanted)
        except CommandError as e:
            if len(wanted) > 1:  # name the package that is not served
                for p, v in specs:
                    self.download_many([(p, v)])
            package, version = specs[0]
            versions = self.versions(package)
            raise InputError(f"{wanted[0]}: not served by the Debian archive"
                             + (f" (available: {', '.join(versions)})" if versions else ""),
                             hint=e.tail or None) from None
        found = {m["file"].split("_", 1)[0]: (m["file"], int(m["size"]), m["sha"])
                 for m in URI_RE.finditer(out)}
        for spec, (package, _) in zip(wanted, specs, strict=True):
            if package not in found:
                raise NetworkError(f"{spec}: apt gave no download location")
        self.debs.mkdir(parents=True, exist_ok=True)
        files = [found[p] for p, _ in specs]
        total = sum(size for _, size, _ in found.values())
        todo = [(spec, size) for spec, (name, size, sha) in zip(wanted, files, strict=True)
                if not self._cached(name, sha)]
        if todo:
            self._fetch([spec for spec, _ in todo], total - sum(size for _, size in todo), total, progress)
        elif progress:
            progress(total, total)
        paths = []
        for name, _, sha in files:
            dest = self.debs / name
            if not dest.exists():
                raise NetworkError(f"{name}: apt reported success but {dest.name} is missing")
            actual = sha256_file(dest)
            if actual != sha:
                dest.unlink()
                raise ChecksumError(f"{dest.name}: sha256 {actual} does not match the archive's {sha}")
            paths.append(dest)
        return paths

    def _cached(self, name: str, sha: str) -> bool:
        dest = self.debs / name
        return dest.exists() and sha256_file(dest) == sha

    def _fetch(self, missing: list[str], have: int, total: int,
               progress: Callable[[int, int | None], None] | None) -> None:
        """apt-get download `missing` into the .deb cache; `have` of `total` bytes are there already."""
        with self._locked():
            for spec in missing:
                log.info("Downloading %s", spec)

            def status(line: str) -> None:  # dlstatus:<item>:<percent of all bytes>:<text>
                m = re.match(r"dlstatus:\d+:(\d+(?:\.\d+)?):", line)
                if m and progress:
                    progress(min(total, have + int(float(m[1]) / 100 * (total - have))), total)

            try:
                argv = ["apt-get", "-q", *self._options(), "-o", "APT::Status-Fd=1", "download", *missing]
                runner.run(argv, timeout=APT_TIMEOUT, cwd=self.debs, inherit_env=True, env={"LC_ALL": "C"},
                           on_line=status)
            except CommandError as e:
                raise NetworkError(f"{', '.join(missing)}: download failed", hint=e.tail) from None
            if progress:
                progress(total, total)

    @staticmethod
    def extract(deb: Path, dest: Path) -> None:
        """Unpack the files of `deb` into `dest` (no maintainer scripts run)."""
        dest.mkdir(parents=True, exist_ok=True)
        runner.run(["dpkg-deb", "-x", deb, dest])
