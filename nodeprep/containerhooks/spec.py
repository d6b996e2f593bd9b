"""The createContainer hook of nodeprep's CDI spec (the hook program's default entry).

    /usr/libexec/nodeprep/cdi-hook --driver VERSION [--ldconfig DIR]      (join/hookprogram.py)

1. The CUDA gate's decision (nodeprep.containerhooks.gate.decide: NVIDIA's NVIDIA_REQUIRE_* rules, the GPU
   facts file, CUDA forward compatibility on data center GPUs only) for the driver the spec mounts
   (`--driver`, written by nodeprep for the versioned root it mounts). Refused: exit 1 with one line;
   the runtime does not start the container. One rule for every container: the gate that hooks.d or
   containerd's base spec runs leaves a container carrying this hook to it.
2. With `--ldconfig DIR`: the image's ld cache rebuilt only when shadowed (nodeprep.containerhooks.container).
"""

from __future__ import annotations

import sys

from . import gate
from .container import check_ldcache, container_env, update_ldcache
from .jsonload import loads, oci_config, rootfs_of


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


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    try:
        bundle, raw = oci_config(sys.stdin.read())
        config = loads(raw.decode())
        env = container_env(config)  # type: ignore[arg-type]
        rootfs = rootfs_of(config, bundle)  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"nodeprep hook: cannot read the container's OCI state/config: {e}", file=sys.stderr)
        return 1
    problem, use_compat = gate.decide(env, args["driver"], gate.read_facts(gate.FACTS),
                                      gate.compat_version(rootfs))
    if problem:
        print(f"nodeprep: container refused: {problem}", file=sys.stderr)
        return 1
    if use_compat:
        update_ldcache(rootfs, gate.COMPAT_DIR, gate.COMPAT_CONF)
    if args.get("ldconfig"):
        check_ldcache(config, rootfs, args["ldconfig"])  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
