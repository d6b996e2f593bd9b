"""The createContainer hook of nodeprep's CDI spec: CUDA requirement check, ld cache only if shadowed.

    python -S -E -c '…from nodeprep.hooks.container import main…' --driver VERSION [--ldconfig DIR]

The runtime runs it in the container's mount namespace (mounts done, before pivot_root and before
the container's process starts), with the OCI state JSON on stdin; `bundle` names the directory
holding the container's config.json.

1. Every NVIDIA_REQUIRE_* variable in the container's environment must be met by the driver the spec
   mounts (`--driver`, written by nodeprep for the versioned root it mounts), evaluated by
   nodeprep.cuda.check_requirement (the code behind `doctor --require-cuda`). Otherwise the hook
   exits 1 with one line naming the requirement, the supported CUDA version and the driver: the
   runtime refuses the container. NVIDIA_DISABLE_REQUIRE=1/true skips the check.
2. With `--ldconfig DIR` (written when NVIDIA's nvidia-cdi-hook is not installed): the spec mounts
   the driver libraries into the loader's default directories of both image layouts, so they are
   found without an ld cache entry. Only an image whose own /etc/ld.so.cache names a library of the
   same name elsewhere (it would win over the default directories) gets DIR written into its
   /etc/ld.so.conf.d/00-nodeprep-nvidia.conf and its ld.so.cache rebuilt by its own ldconfig.

Starts on every container start: stdlib os/sys only on the common path (no json, re, click, yaml,
logging or argparse); `bench/container_start.py` measures what it adds.
"""

from __future__ import annotations

import os
import sys

CONF_NAME = "00-nodeprep-nvidia.conf"
LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
LD_CACHE = "/etc/ld.so.cache"
LIB64 = "/usr/lib64"  # the RHEL/UBI loader's default directory; the spec mounts the libraries there too
TRUE = ("1", "true", "yes", "on")


def _args(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    it = iter(argv)
    for a in it:
        if a not in ("--driver", "--ldconfig"):
            raise SystemExit(f"nodeprep hook: unknown argument {a!r}")
        out[a[2:]] = next(it, "")
    if not out.get("driver"):
        raise SystemExit("nodeprep hook: --driver VERSION is required")
    return out


def container_env(config: dict) -> dict[str, str]:  # type: ignore[type-arg]
    env: dict[str, str] = {}
    for item in config.get("process", {}).get("env", []) or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return env


def requirement_problem(env: dict[str, str], driver: str) -> str | None:
    """The one-line refusal for `env` on `driver`, or None when the container may start (pure)."""
    if env.get("NVIDIA_DISABLE_REQUIRE", "").strip().lower() in TRUE:
        return None
    from ..cuda import check_requirement
    from ..errors import InputError

    for key in sorted(k for k in env if k.startswith("NVIDIA_REQUIRE_")):
        if not env[key].strip():
            continue
        try:
            ok, message = check_requirement(env[key], driver, source=key)
        except InputError as e:
            return f"{e} (set NVIDIA_DISABLE_REQUIRE=1 to skip the check)"
        if not ok:
            return f"{message} (set NVIDIA_DISABLE_REQUIRE=1 to skip the check)"
    return None


def mounted_libraries(config: bytes, lib_dir: str) -> set[str]:
    """Names of the files mounted into `lib_dir` (`"destination": "<lib_dir>/NAME"` in config.json;
    pure, no JSON parser: the names are plain file names)."""
    names: set[str] = set()
    needle = ('"' + lib_dir.rstrip("/") + "/").encode()
    at = config.find(needle)
    while at >= 0:
        start = at + len(needle)
        end = config.find(b'"', start)
        name = config[start:end]
        if end > start and b"/" not in name and b"\\" not in name:
            names.add(name.decode(errors="replace"))
        at = config.find(needle, max(end, start))
    return names


def shadowing_entries(cache: bytes, names: set[str], mounted_dirs: tuple[str, ...]) -> list[str]:
    """Paths in an ld.so.cache outside `mounted_dirs` whose file name is one of `names` (pure): the
    loader would take them before its default directories. ldconfig records every library under
    its soname link's path, and the paths are NUL-terminated strings of the cache's string table,
    so no parsing of its binary entries is needed; a false hit would only cost an ldconfig run."""
    dirs = {d.rstrip("/") for d in mounted_dirs}
    out = set()
    for raw in cache.split(b"\0"):
        if raw.startswith(b"/"):
            parent, _, name = raw.decode(errors="replace").rpartition("/")
            if name in names and parent not in dirs:
                out.add(f"{parent}/{name}")
    return sorted(out)


def update_ldcache(rootfs: str, lib_dir: str) -> None:
    """Add `lib_dir` to the image's ld.so.conf.d and run the image's ldconfig (chroot)."""
    conf_dir = os.path.join(rootfs, "etc/ld.so.conf.d")
    try:
        os.makedirs(conf_dir, exist_ok=True)
        with open(os.path.join(conf_dir, CONF_NAME), "w") as f:
            f.write(lib_dir + "\n")
    except OSError as e:  # read-only image: its own copies stay first
        print(f"nodeprep hook: ld cache not updated ({e.strerror}: {conf_dir})", file=sys.stderr)
        return
    tool = next((t for t in LDCONFIG if os.path.lexists(rootfs + t)), None)
    if tool is None:
        print("nodeprep hook: no ldconfig in the image; ld cache not updated", file=sys.stderr)
        return
    from .. import runner
    from ..errors import CommandError

    try:
        runner.run([tool, lib_dir], root=rootfs, timeout=30)
    except CommandError as e:
        print(f"nodeprep hook: ldconfig failed in the image: {e}", file=sys.stderr)


def _string_value(text: bytes, key: bytes) -> str | None:
    """The string value of `"key"` when it occurs exactly once, is a plain string (no escapes) and
    follows its key directly; None otherwise (then the caller parses the JSON properly)."""
    quoted = b'"' + key + b'"'
    at = text.find(quoted)
    if at < 0 or text.find(quoted, at + 1) >= 0:
        return None
    rest = text[at + len(quoted):].lstrip()
    if not rest.startswith(b":"):
        return None
    rest = rest[1:].lstrip()
    end = rest.find(b'"', 1)
    if not rest.startswith(b'"') or end < 0 or b"\\" in rest[:end]:
        return None
    return rest[1:end].decode()


def _root_path(config: bytes) -> str | None:
    """root.path of config.json without a JSON parser (None: parse it properly)."""
    at = config.find(b'"root"')
    return _string_value(config[at:], b"path") if at >= 0 and config.count(b'"root"') == 1 else None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def check_ldcache(config: bytes, rootfs: str, lib_dir: str) -> None:
    """Rebuild the image's ld cache only when it names a library the spec mounts somewhere else."""
    cache = _read(rootfs + LD_CACHE)
    if not cache:
        return
    names = mounted_libraries(config, lib_dir)
    if names and shadowing_entries(cache, names, (lib_dir, LIB64)):
        update_ldcache(rootfs, lib_dir)


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    try:
        state = sys.stdin.read().encode()
        bundle = _string_value(state, b"bundle")
        raw = _read(os.path.join(bundle, "config.json")) if bundle else None
        root = _root_path(raw) if raw is not None else None
        config = None
        if raw is None or root is None or b"NVIDIA_REQUIRE_" in raw:
            # the common case, a container without NVIDIA_REQUIRE_*, is decided without importing
            # json (and re), which is most of the hook's start-up cost
            import json

            bundle = json.loads(state)["bundle"]
            with open(os.path.join(bundle, "config.json"), "rb") as f:
                raw = f.read()
            config = json.loads(raw)
            root = config.get("root", {}).get("path", "rootfs")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"nodeprep hook: cannot read the container's OCI state/config: {e}", file=sys.stderr)
        return 1
    if config is not None:
        problem = requirement_problem(container_env(config), args["driver"])
        if problem:
            print(f"nodeprep: container refused: {problem}", file=sys.stderr)
            return 1
    if args.get("ldconfig"):
        rootfs = root if os.path.isabs(root) else os.path.join(bundle, root)
        check_ldcache(raw, rootfs, args["ldconfig"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
