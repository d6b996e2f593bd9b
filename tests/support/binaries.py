"""Reference binaries that tests find through one NODEPREP_* variable naming a directory: each binary
there either plain or as `NAME.zst` (zstd, long window), checked against a sha256 list kept in
tests/support. Compressed ones are decompressed once into `<test cache>/<subdir>/<sha256>/NAME`
(under an flock, so parallel test processes share one copy). Used by controlplane.py (Kubernetes)
and nvidia.py (NVIDIA's GPU stack); `pinned` checks one file the same way for companions.py and
mocknvml.py."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path


def read_sha256_list(path: Path) -> dict[str, str]:
    """NAME -> sha256 from a `sha256sum`-style list."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split()
            out[name] = digest
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def not_set(env: str, what: str) -> str:
    """The skip reason where `$env`, which names `what`, is not set."""
    return f"{env} is not set: it names {what}"


def unavailable(env: str, names: Iterable[str], what: str) -> str | None:
    """Why `names` cannot be had from the directory `$env` names (`what`): the variable not set, or
    names it holds neither plain nor as NAME.zst; None when they can."""
    where = os.environ.get(env)
    if not where:
        return not_set(env, what)
    lacking = missing(env, names)
    if lacking:
        return f"{env}={where} lacks {', '.join(lacking)}"
    return None


def pinned(env: str, what: str, name: str, digest: str, differs: str) -> Path | str:
    """The path of file `name` in the directory `$env` names (`what`) when its sha256 is `digest`, or
    why not (a skip reason): the variable not set, no such file, or the path followed by `differs`."""
    where = os.environ.get(env)
    if not where:
        return not_set(env, what)
    path = Path(where) / name
    if not path.is_file():
        return f"{env}={where} has no {name}"
    if sha256_file(path) != digest:
        return f"{path}{differs}"
    return path


def missing(env: str, names: Iterable[str]) -> list[str]:
    """Those of `names` the directory `$env` holds neither plain nor as NAME.zst."""
    d = Path(os.environ[env])
    return [n for n in names if not (d / n).is_file() and not (d / f"{n}.zst").is_file()]


def verified(env: str, names: Iterable[str], sha_file: Path, cache: Path) -> dict[str, Path]:
    """Paths of `names` from the directory `$env`, sha256-verified against `sha_file`; .zst ones
    decompressed once into `cache`."""
    import zstandard

    src = Path(os.environ[env])
    want = read_sha256_list(sha_file)
    out: dict[str, Path] = {}
    for name in names:
        digest = want[name]
        plain = src / name
        if plain.is_file():
            if sha256_file(plain) != digest:
                raise RuntimeError(f"{plain}: sha256 differs from {sha_file.name}")
            out[name] = plain
            continue
        dest = cache / digest / name
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(dest.parent / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not dest.is_file():
                    part = dest.with_suffix(".part")
                    with (src / f"{name}.zst").open("rb") as fin, part.open("wb") as fout:
                        zstandard.ZstdDecompressor(max_window_size=1 << 31).copy_stream(fin, fout)
                    if sha256_file(part) != digest:
                        part.unlink()
                        raise RuntimeError(f"{src / name}.zst: sha256 differs from {sha_file.name}")
                    part.chmod(0o755)
                    part.rename(dest)
        out[name] = dest
    return out
