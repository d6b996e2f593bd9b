"""Reference binaries that tests find through one NODEPREP_* variable naming a directory: each binary
there either plain or as `NAME.zst` (zstd, long window), checked against a sha256 list kept in
tests/support. Compressed ones are decompressed once into `<test cache>/<subdir>/<sha256>/NAME`
(under an flock, so parallel test processes share one copy). Used by controlplane.py (Kubernetes)
and nvidia.py (NVIDIA's GPU stack)."""

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
