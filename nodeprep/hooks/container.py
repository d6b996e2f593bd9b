"""The createContainer hook of nodeprep's CDI spec: CUDA requirement check and ld cache.

    python -S -E -c '…from nodeprep.hooks.container import main…' --driver VERSION [--ldconfig DIR]

The runtime runs it in the container's mount namespace before the container's process starts, with
the OCI state JSON on stdin; `bundle` names the directory holding the container's config.json.

1. Every NVIDIA_REQUIRE_* variable in the container's environment must be met by the driver the spec
   mounts (`--driver`, written by nodeprep for the versioned root it mounts), evaluated by
   nodeprep.cuda.check_requirement (the code behind `doctor --require-cuda`). Otherwise the hook
   exits 1 with one line naming the requirement, the supported CUDA version and the driver: the
   runtime refuses the container. NVIDIA_DISABLE_REQUIRE=1/true skips the check.
2. With `--ldconfig DIR` (written when NVIDIA's nvidia-cdi-hook is not installed): DIR goes into the
   image's /etc/ld.so.conf.d/00-nodeprep-nvidia.conf and the image's own ldconfig rebuilds its
   ld.so.cache, so images whose loader does not search DIR by default (RHEL/UBI lib64 layouts) find
   the driver libraries.

Starts on every container start: stdlib json/os/sys and nodeprep.cuda only (no click, yaml,
logging or argparse); `bench/container_start.py` measures what it adds.
"""

from __future__ import annotations

import os
import sys

CONF_NAME = "00-nodeprep-nvidia.conf"
LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
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


def update_ldcache(rootfs: str, lib_dir: str) -> None:
    """Add `lib_dir` to the image's ld.so.conf.d and run the image's ldconfig (chroot)."""
    conf_dir = os.path.join(rootfs, "etc/ld.so.conf.d")
    try:
        os.makedirs(conf_dir, exist_ok=True)
        with open(os.path.join(conf_dir, CONF_NAME), "w") as f:
            f.write(lib_dir + "\n")
    except OSError as e:  # read-only image: the default search path has to do
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


def _config_bytes(state: str) -> bytes | None:
    """config.json's bytes, found through the state's `"bundle": "<path>"` without a JSON parser;
    None when the state does not have that simple shape (then it is parsed properly)."""
    key = '"bundle":'
    at = state.find(key)
    if at < 0:
        return None
    rest = state[at + len(key):].lstrip()
    end = rest.find('"', 1)
    if not rest.startswith('"') or end < 0 or "\\" in rest[:end]:
        return None
    try:
        with open(os.path.join(rest[1:end], "config.json"), "rb") as f:
            return f.read()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    try:
        state = sys.stdin.read()
        if not args.get("ldconfig"):
            # the common case, a container without NVIDIA_REQUIRE_*: decided without importing json
            # (and re), which is most of the hook's start-up cost
            raw = _config_bytes(state)
            if raw is not None and b"NVIDIA_REQUIRE_" not in raw:
                return 0
        import json

        bundle = json.loads(state)["bundle"]
        with open(os.path.join(bundle, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"nodeprep hook: cannot read the container's OCI state/config: {e}", file=sys.stderr)
        return 1
    problem = requirement_problem(container_env(config), args["driver"])
    if problem:
        print(f"nodeprep: container refused: {problem}", file=sys.stderr)
        return 1
    if args.get("ldconfig"):
        root = config.get("root", {}).get("path", "rootfs")
        update_ldcache(root if os.path.isabs(root) else os.path.join(bundle, root), args["ldconfig"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
