"""The createContainer hook of nodeprep's CDI spec (the hook program's default entry).

    /usr/libexec/nodeprep/cdi-hook --driver VERSION [--ldconfig DIR]
        [--nvidia-cdi-hook PATH [--disable-device-node-modification]]
        [--libraries LIBDIR --link NAME[=ENTRY]...]                       (runtime/hookprogram.py)

1. The CUDA gate's decision (nodeprep.containerhooks.gate.decide: NVIDIA's NVIDIA_REQUIRE_* rules, the GPU
   facts file, CUDA forward compatibility on data center GPUs only) for the driver the spec mounts
   (`--driver`, written by nodeprep for the versioned root it mounts). Refused: exit 1 with one line;
   the runtime does not start the container. One rule for every container: the gate that hooks.d or
   containerd's base spec runs leaves a container carrying this hook to it.
   With `--nvidia-cdi-hook` (NVIDIA's hook installed on the node) and an image with CUDA compat
   libraries (/usr/local/cuda/compat/libcuda.so.*), NVIDIA's `enable-cuda-compat` run from here.
2. With `--libraries`: each NAME linked to LIBDIR/ENTRY (the library folder the spec mounts) in the
   image's loader default directory, DIR or /usr/lib64 (nodeprep.containerhooks.container).
3. With `--ldconfig DIR`: the image's ld cache rebuilt only when shadowed (the same module). Without
   `--libraries` (a spec of before, mounting each file into DIR and /usr/lib64) the names are the
   files mounted into DIR.
4. With `--disable-device-node-modification`: this process becomes NVIDIA's hook of that name
   (exec, the OCI state on its stdin), so that the runtime starts one hook process, not two.
"""

from __future__ import annotations

import posix
import sys

from . import gate
from .container import (
    HOOK_ENV,
    LIB64,
    check_ldcache,
    container_env,
    link_dir,
    link_libraries,
    mounted_libraries,
    update_ldcache,
)
from .jsonload import loads, oci_config, rootfs_of


def _args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The options given once, and the --link values in order."""
    out: dict[str, str] = {}
    links: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--link":
            links.append(next(it, ""))
        elif a in ("--driver", "--ldconfig", "--libraries", "--nvidia-cdi-hook"):
            out[a[2:]] = next(it, "")
        elif a == "--disable-device-node-modification":
            out[a[2:]] = "yes"
        else:
            raise SystemExit(f"nodeprep hook: unknown argument {a!r}")
    if not out.get("driver"):
        raise SystemExit("nodeprep hook: --driver VERSION is required")
    if out.get("libraries") and not out.get("ldconfig"):
        raise SystemExit("nodeprep hook: --libraries needs --ldconfig DIR")
    if out.get("disable-device-node-modification") and not out.get("nvidia-cdi-hook"):
        raise SystemExit("nodeprep hook: --disable-device-node-modification needs --nvidia-cdi-hook PATH")
    return out, links


def _links(values: list[str]) -> list[tuple[str, str]]:
    """(NAME, ENTRY) of each --link NAME[=ENTRY]; names that are no plain file name are dropped."""
    out = []
    for value in values:
        name, _, entry = value.partition("=")
        entry = entry or name
        if all(n and "/" not in n and n not in (".", "..") for n in (name, entry)):
            out.append((name, entry))
    return out


def nvidia_cuda_compat(tool: str, driver: str, state: str) -> str | None:
    """NVIDIA's `enable-cuda-compat` (`tool`: its nvidia-cdi-hook) for this container, the OCI state
    on its stdin; why it failed, or None. Run only for an image with CUDA compat libraries: the one
    case it does anything in, so that every other start is spared a second hook process."""
    # lazy: the container hook
    from .. import runner
    from ..errors import CommandError

    try:
        runner.run([tool, "enable-cuda-compat", f"--host-driver-version={driver}"], input=state, timeout=30,
                   env=HOOK_ENV, sealed=True, cwd="/")
    except CommandError as e:
        return str(e)
    return None


def become_nvidia_hook(tool: str, command: str, state: str) -> str:
    """Replace this process with NVIDIA's hook `command` (`tool`: its nvidia-cdi-hook), the OCI state
    on its stdin, HOOK_ENV its whole environment, in /: its exit status is the hook's. Returns only
    on failure, saying why."""
    try:
        fd = posix.memfd_create("oci-state")
        data = state.encode()
        while data:
            data = data[posix.write(fd, data):]
        posix.lseek(fd, 0, 0)
        posix.dup2(fd, 0)
        posix.close(fd)
        sys.stdout.flush()
        sys.stderr.flush()
        posix.chdir("/")
        posix.execve(tool, [tool, command], HOOK_ENV)
    except (OSError, AttributeError) as e:  # AttributeError: no memfd_create (not Linux)
        return str(e)
    return "exec returned"  # pragma: no cover - execv does not return


def main(argv: list[str] | None = None) -> int:
    args, link_values = _args(sys.argv[1:] if argv is None else argv)
    try:
        state = sys.stdin.read()
        bundle, raw = oci_config(state)
        config = loads(raw.decode())
        env = container_env(config)
        rootfs = rootfs_of(config, bundle)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"nodeprep hook: cannot read the container's OCI state/config: {e}", file=sys.stderr)
        return 1
    compat = gate.compat_version(rootfs)
    problem, use_compat = gate.decide(env, args["driver"], gate.read_facts(gate.FACTS), compat)
    if problem:
        print(f"nodeprep: container refused: {problem}", file=sys.stderr)
        return 1
    if compat and args.get("nvidia-cdi-hook"):
        failed = nvidia_cuda_compat(args["nvidia-cdi-hook"], args["driver"], state)
        if failed:
            print(f"nodeprep hook: nvidia-cdi-hook enable-cuda-compat failed: {failed}", file=sys.stderr)
            return 1
    if use_compat:
        update_ldcache(rootfs, gate.COMPAT_DIR, gate.COMPAT_CONF)
    lib_dir = args.get("ldconfig")
    if lib_dir and args.get("libraries"):
        links = _links(link_values)
        where = link_dir(rootfs, lib_dir)
        _, own = link_libraries(rootfs, where, args["libraries"], links)
        check_ldcache(rootfs, {n for n, _ in links}, (args["libraries"], where),
                      args["libraries"] if own else where, shadowed=bool(own))
    elif lib_dir:
        check_ldcache(rootfs, mounted_libraries(config, lib_dir), (lib_dir, LIB64), lib_dir)
    if args.get("disable-device-node-modification"):
        command = "disable-device-node-modification"
        failed = become_nvidia_hook(args["nvidia-cdi-hook"], command, state)
        print(f"nodeprep hook: nvidia-cdi-hook {command} failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
