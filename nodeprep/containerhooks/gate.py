"""The CUDA gate: one createContainer hook for every container, however it got an NVIDIA GPU.

    /usr/libexec/nodeprep/cdi-hook gate [--driver-root DIR] [--facts FILE]   (runtime/hookprogram.py)

The runtime runs it for every container (podman/CRI-O: the OCI hook nodeprep writes into
/etc/containers/oci/hooks.d, `when: {always: true}`), with the OCI state JSON on stdin. It decides
from the container's own config.json whether the container has an NVIDIA GPU, whatever put it there
(nodeprep's `nvidia.com/gpu` CDI spec, a DRA claim's spec, NVIDIA's runtime, `--device`): a device
node named /dev/nvidia* or with NVIDIA's character major 195 in linux.devices or the mounts, or
NVIDIA_VISIBLE_DEVICES with NVIDIA's runtime hook in the spec. Any other container exits at once,
mostly before its config is even parsed (no "nvidia" and no "195" in its bytes).

For a GPU container, NVIDIA's rules (nvidia-container-toolkit internal/requirements): every
NVIDIA_REQUIRE_* must hold (AND), space = OR, comma = AND, properties `cuda`, `driver`, `arch`,
`brand` (others skipped), NVIDIA_DISABLE_REQUIRE=1/true turns the check off. Facts: the driver the
node runs (`--driver-root`'s link target, /opt/nvidia/current -> <version>; else the loaded
module's /sys/module/nvidia/version), the CUDA it supports (nodeprep.cuda's table), and each GPU's
brand and compute capability from the facts file (`--facts`, JSON `{"gpus": [{"brand": "tesla",
"arch": "7.5"}, ...]}`; none known: a brand/arch constraint never holds).

CUDA forward compatibility as NVIDIA's `enable-cuda-compat` does it, but only where the GPU supports
it: when the image's /usr/local/cuda/compat/libcuda.so.<version> is newer than the node's driver and
every GPU's brand is a data center one (nodeprep.cuda.FORWARD_COMPAT_BRANDS), the directory is put
first in the image's ld cache (/etc/ld.so.conf.d/00-compat-nodeprep.conf, the image's ldconfig) and
a requirement is also met by what the compat library supports. On a GeForce the compat library is
left alone (it would fail with CUDA error 804) and a too-new requirement is refused, saying why.

Refused: exit 1 with one line naming the requirement; the runtime does not start the container.
A container carrying the hook of nodeprep's own CDI spec (nodeprep.containerhooks.spec) is left to that hook,
which takes the same decision (`decide`) for the driver its spec mounts: one decision per start.
Runs for every container, so a container without a GPU is decided with sys and the C JSON scanner
alone (nodeprep.containerhooks.jsonload): nodeprep.containerhooks.container and, for a container
with a requirement, nodeprep.cuda are imported for a GPU container only; no hook imports os (~1.5 ms
of CPU at each start), posix (its C half, already loaded) does.
"""

from __future__ import annotations

import posix
import sys

from .jsonload import loads, oci_config, rootfs_of

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a hook's start-up cost
if TYPE_CHECKING:
    from typing import Any

DRIVER_ROOT = "/opt/nvidia/current"
FACTS = "/opt/nvidia/gpu-facts.json"  # beside the driver roots (node.state ignores plain files there)
MODULE_VERSION = "/sys/module/nvidia/version"
NVIDIA_MAJOR = 195  # /dev/nvidia[0-9]*, nvidiactl, nvidia-modeset (devices.txt)
RUNTIME_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit")  # NVIDIA's legacy mode
COMPAT_DIR = "/usr/local/cuda/compat"
COMPAT_CONF = "00-compat-nodeprep.conf"
MAX_FACTS = 1 << 20
NO_GPU = ("", "void", "none")


def _args(argv: list[str]) -> dict[str, str]:
    out = {"driver-root": DRIVER_ROOT, "facts": FACTS}
    it = iter(argv)
    for a in it:
        if a not in ("--driver-root", "--facts"):
            raise SystemExit(f"nodeprep gate: unknown argument {a!r}")
        out[a[2:]] = next(it, "")
    return out


def has_nvidia_gpu(config: dict[str, Any], env: dict[str, str]) -> bool:
    """Does the OCI config give the container an NVIDIA GPU (pure)?"""
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    for d in devices if isinstance(devices, list) else []:
        if isinstance(d, dict) and (str(d.get("path", "")).startswith("/dev/nvidia")
                                    or (d.get("type") == "c" and d.get("major") == NVIDIA_MAJOR)):
            return True
    mounts = config.get("mounts")
    for m in mounts if isinstance(mounts, list) else []:
        if isinstance(m, dict) and str(m.get("destination", "")).startswith("/dev/nvidia"):
            return True
    if env.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower() not in NO_GPU:
        hooks = config.get("hooks") or {}
        for stage in hooks.values() if isinstance(hooks, dict) else []:
            for h in stage if isinstance(stage, list) else []:
                if isinstance(h, dict) and str(h.get("path", "")).rpartition("/")[2] in RUNTIME_HOOKS:
                    return True
    return False


def carries_spec_hook(config: dict[str, Any]) -> bool:
    """Does nodeprep's CDI spec hook (the hook program without an entry, `--driver V`) run for this
    container? From the runtime-made hooks of the config, never from the image or its environment."""
    hooks = config.get("hooks")
    stage = hooks.get("createContainer") if isinstance(hooks, dict) else None
    for h in stage if isinstance(stage, list) else []:
        args = h.get("args") if isinstance(h, dict) else None
        if (isinstance(args, list) and str(h.get("path", "")).endswith("/cdi-hook") and len(args) > 2
                and args[1] == "--driver"):
            return True
    return False


def driver_version(driver_root: str) -> str | None:
    """The node's driver: the versioned root `driver_root` links to, else the loaded module's."""
    try:
        name = posix.readlink(driver_root).rstrip("/").rpartition("/")[2]
    except OSError:
        name = ""
    if not name:
        try:
            with open(MODULE_VERSION, encoding="ascii") as f:
                name = f.read(64).strip()
        except (OSError, ValueError):
            return None
    parts = name.split(".")
    return name if len(parts) >= 2 and all(p.isdigit() for p in parts) else None


def read_facts(path: str) -> list[dict[str, str | None]]:
    """Each GPU's {"brand", "arch"} from the facts file; [] when missing or malformed."""
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK)
        with open(fd, "rb") as f:
            data = loads(f.read(MAX_FACTS).decode())
    except (OSError, ValueError):
        return []
    gpus = data.get("gpus") if isinstance(data, dict) else None
    out = []
    for g in gpus if isinstance(gpus, list) else []:
        if isinstance(g, dict):
            out.append({k: g[k] if isinstance(g.get(k), str) else None for k in ("brand", "arch")})
    return out


def compat_version(rootfs: str) -> str | None:
    """The newest version of the image's /usr/local/cuda/compat/libcuda.so.<version>, if any."""
    # lazy: labels --help, Ansible nodeprep_labels
    from .container import in_image

    path = in_image(rootfs, COMPAT_DIR)
    try:
        names = posix.listdir(path) if path else []
    except OSError:
        return None
    found = [n[len("libcuda.so."):] for n in names if n.startswith("libcuda.so.")]
    if not found:
        return None
    from ..cuda import is_version, vkey  # only for an image with compat libraries: a start's cost

    found = [v for v in found if "." in v and is_version(v)]
    return max(found, key=vkey) if found else None


def decide(
    env: dict[str, str], driver: str | None, gpus: list[dict[str, str | None]], compat: str | None
) -> tuple[str | None, bool]:
    """(the one-line refusal or None, whether to enable the image's compat libcuda) (pure)."""
    # lazy: labels --help, Ansible nodeprep_labels
    from .container import TRUE

    keys = sorted(k for k in env if k.startswith("NVIDIA_REQUIRE_") and env[k].strip())
    disabled = env.get("NVIDIA_DISABLE_REQUIRE", "").strip().lower() in TRUE
    if compat is None and (not keys or disabled):
        return None, False  # nothing to check or enable: decided without importing nodeprep.cuda
    # lazy: the container hook, labels --help, Ansible nodeprep_join and 4 more starts
    from ..cuda import forward_compatible, max_cuda, parse_requirement, requirements_hold, vkey
    from ..errors import InputError

    newer = compat if compat and driver and vkey(compat) > vkey(driver) else None
    use_compat = bool(newer) and forward_compatible(gpus)
    if not keys or disabled:
        return None, use_compat
    skip = " (set NVIDIA_DISABLE_REQUIRE=1 to skip the check)"
    if driver is None:
        return f"{keys[0]} cannot be checked: no NVIDIA driver found ({DRIVER_ROOT}, {MODULE_VERSION})" \
            + skip, False
    parsed = {}
    for key in keys:
        try:
            parsed[key] = parse_requirement(env[key], source=key, skip_unknown=True)
        except InputError as e:
            return f"{e}{skip}", False
    if requirements_hold(list(parsed.values()), driver, gpus):
        return None, use_compat
    # use_compat only with a newer compat libcuda: `newer` is then a str (here and below)
    if use_compat and requirements_hold(list(parsed.values()), newer, gpus):  # type: ignore[arg-type]
        return None, True
    key = next(k for k, alts in parsed.items() if not requirements_hold([alts], driver, gpus))
    cudas = [f"{op}{v}" for alt in parsed[key] for k, op, v in alt if k == "cuda"]
    cuda_only = [[c for c in alt if c[0] == "cuda"] for alt in parsed[key]]
    cuda_only = [alt for alt in cuda_only if alt]
    supported = f"driver {driver} supports up to CUDA {max_cuda(driver) or 'none'}"
    if cudas and not requirements_hold([cuda_only], driver, gpus):  # the CUDA version is what fails
        line = f"{key} requires CUDA {cudas[0]}, but {supported}"
    else:  # a brand, arch or driver constraint: say what the node has
        seen = "; ".join(f"brand {g.get('brand') or 'unknown'}, arch {g.get('arch') or 'unknown'}"
                         for g in gpus) or f"no GPU facts in {FACTS}"
        line = f"{key}={env[key].strip()} is not met: {supported}; GPUs: {seen}"
    if newer and not use_compat:
        brands = ",".join(sorted({str(g.get("brand") or "unknown").lower() for g in gpus})) or "unknown"
        line += (f"; the image's forward-compatibility libcuda {newer} is not used: GPU brand {brands} "
                 "does not support CUDA forward compatibility")
    elif use_compat:
        line += f", and the image's forward-compatibility libcuda {newer} up to CUDA {max_cuda(newer)}"  # type: ignore[arg-type]  # set: use_compat
    return line + skip, False


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    try:
        bundle, raw = oci_config(sys.stdin.read())
        if b"nvidia" not in raw and b"195" not in raw:
            return 0  # no NVIDIA GPU: the common case, decided without parsing
        # lazy: labels --help, Ansible nodeprep_labels
        from .container import container_env, update_ldcache

        config = loads(raw.decode())
        env = container_env(config)
        rootfs = rootfs_of(config, bundle)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"nodeprep gate: cannot read the container's OCI state/config: {e}", file=sys.stderr)
        return 1
    if not has_nvidia_gpu(config, env) or carries_spec_hook(config):
        return 0
    problem, use_compat = decide(env, driver_version(args["driver-root"]), read_facts(args["facts"]),
                                 compat_version(rootfs))
    if problem:
        print(f"nodeprep: container refused: {problem}", file=sys.stderr)
        return 1
    if use_compat:
        update_ldcache(rootfs, COMPAT_DIR, COMPAT_CONF)
    return 0


if __name__ == "__main__":
    sys.exit(main())
