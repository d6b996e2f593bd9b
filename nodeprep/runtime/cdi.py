"""The CDI spec /etc/cdi/nvidia.yaml, generated from the active driver root.

The driver root is /opt/nvidia/current -> <version>; its userspace manifest
(/opt/nvidia/<version>/manifest.json) lists lib64/ and bin/. The spec mounts the versioned files
(not `current`, so a driver switch never changes a running container's mounts; activation rewrites
the spec) read-only into the container:
- the lib64/ folder once, at its node path (/opt/nvidia/<version>/lib64); nodeprep's hook links each
  library name (every real file, every soname/dev link to one, EXTRA_NAMES) into the image loader's
  default directory — the multiarch directory (/usr/lib/x86_64-linux-gnu on amd64, searched by
  Debian/Ubuntu's glibc), or /usr/lib64 in an image whose C library is there (RHEL/UBI) — so no ld
  cache entry is needed for glibc to find them (one mount and a few links cost a container start
  less than a mount per name and directory: docs/join.md, the bench);
- binaries at /usr/bin, GSP firmware at /lib/firmware/nvidia/<version>/;
- daemon sockets (persistenced, fabricmanager, MPS) when present under the device root.
Hooks (createContainer): nodeprep's own (nodeprep.containerhooks.spec, run as the self-contained program
/usr/libexec/nodeprep/cdi-hook written with the spec: hookprogram.py) on every container: it refuses a
container whose NVIDIA_REQUIRE_* the mounted driver does not meet and rebuilds the image's
ld.so.cache only if that cache names a library of the same name elsewhere (which the loader would
take first) or misses a CUDA compat folder. With NVIDIA's nvidia-cdi-hook on the node, its hooks run
first for what only they do (`hooks`). Devices: one per GPU by index and by UUID, plus `all` (names
as nvidia-ctk's default `--device-name-strategy`; `all` also carries MIG's /dev/nvidia-caps nodes).
What NVIDIA's `nvidia-ctk cdi generate` carries and nodeprep leaves out on purpose: docs/join.md.

The spec declares cdiVersion 0.5.0 (device names starting with a digit) and uses nothing newer:
podman 4.3's CDI library knows no version above 0.5.0 and refuses unknown fields. Before it is
written the spec is validated against nodeprep/data/cdi.schema.json (written from the CDI
specification) *and* against its declared version: `cdi_version_problems` lists every field that
needs a later cdiVersion (the SPEC.md version history).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from ..artifact import Manifest
from ..atomicfile import atomic_write
from ..errors import NodeprepError, StateError
from ..profile import Driver, Runtime
from ..safetar import MANIFEST
from .files import FileChange, under, writable_problem
from .gpus import GpuDevice, GpuList
from .hookprogram import hook_command, hook_program, python_problem

log = logging.getLogger(__name__)

CDI_VERSION = "0.5.0"  # device names starting with a digit need 0.5.0; nothing newer is used
# Released CDI spec versions, oldest first (SPEC.md "Released versions"; 0.3.0 is the earliest the
# reference library still accepts).
CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
KIND = "nvidia.com/gpu"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "data" / "cdi.schema.json"
DRIVER_BASE = "/opt/nvidia"
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
LIB_DIRS = {"amd64": "/usr/lib/x86_64-linux-gnu", "arm64": "/usr/lib/aarch64-linux-gnu"}
CDI_HOOK = "nvidia-cdi-hook"
# The node's PATH, searched under --root for nvidia-cdi-hook (NVIDIA's Container Toolkit).
TOOL_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
SPEC_NAME = "nvidia.yaml"
# Names applications dlopen that no soname link provides, by the soname they point at (what NVIDIA's
# `create-symlinks` makes: toolkit internal/discover/symlinks.go, graphics.go).
EXTRA_NAMES = {
    "libcuda.so.1": ("libcuda.so",),
    "libnvidia-opticalflow.so.1": ("libnvidia-opticalflow.so",),
    "libGLX_nvidia.so.0": ("libGLX_indirect.so.0",),
}
# Daemon sockets and pipes mounted when present under the device root (toolkit internal/discover/ipc.go).
IPC_PATHS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket", "/tmp/nvidia-mps")
IPC_OPTIONS = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
CAPS_DIR = "/dev/nvidia-caps"
PARAMS = "/proc/driver/nvidia/params"  # what `disable-device-node-modification` covers in the container


def active_driver(root: Path) -> str:
    """The version /opt/nvidia/current points at (StateError when there is none)."""
    link = under(root, f"{DRIVER_BASE}/current", follow_last=False)
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        raise StateError(
            f"{DRIVER_BASE}/current does not exist: no active driver", hint="run `nodeprep install` first"
        ) from None
    except OSError:
        raise StateError(f"{DRIVER_BASE}/current is not a symlink") from None
    return Path(target).name


def load_driver_manifest(root: Path, version: str) -> Manifest:
    path = under(root, f"{DRIVER_BASE}/{version}/{MANIFEST}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StateError(
            f"{DRIVER_BASE}/{version}/{MANIFEST} is missing: the driver root is incomplete",
            hint="run `nodeprep doctor`",
        ) from None
    return Manifest.from_json(raw, source=f"{DRIVER_BASE}/{version}/{MANIFEST}")


def _mounts(root: Path, version: str, manifest: Manifest) -> tuple[list[dict[str, Any]], list[str]]:
    """The driver root's mounts and the `--link` values of nodeprep's hook: its lib64/ folder once,
    at its node path, and each library name the loader looks up (every real file, every soname/dev
    link resolving to one, the EXTRA_NAMES of those) as NAME or NAME=ENTRY (the folder's entry it
    links to); bin/ files and the GSP firmware as files."""
    host_base = f"{DRIVER_BASE}/{version}"
    regular = {rel for rel, e in manifest.files.items() if e.target is None}
    links: dict[str, str] = {}  # link rel path -> regular file rel path it resolves to
    for rel, e in manifest.files.items():
        if e.target is not None:
            links[rel] = rel
    lib64 = under(root, f"{host_base}/lib64")
    if lib64.is_dir():  # soname links made on the node by ldconfig -n are not in the manifest
        for p in lib64.iterdir():
            if p.is_symlink():
                links[f"lib64/{p.name}"] = f"lib64/{p.name}"
    mounts: list[dict[str, Any]] = []
    missing = [
        rel
        for rel in sorted(regular)
        if rel.startswith(("lib64/", "bin/")) and not under(root, f"{host_base}/{rel}").is_file()
    ]
    if missing:
        raise StateError(
            f"driver root {host_base} is missing {len(missing)} file(s) from its manifest, e.g. {missing[0]}",
            hint="run `nodeprep doctor`",
        )
    names: list[str] = []
    for rel in sorted(regular):
        name = Path(rel).name
        if rel.startswith("lib64/") and rel.count("/") == 1:
            names.append(name)
        elif rel.startswith("bin/") and rel.count("/") == 1:
            mounts.append(_mount(f"{host_base}/{rel}", f"/usr/bin/{name}"))
        elif rel.startswith("firmware/nvidia/") and ".." not in rel.split("/"):  # GSP firmware
            mounts.append(_mount(f"{host_base}/{rel}", f"/lib/{rel}"))
    for rel in sorted(links):
        if not rel.startswith("lib64/") or rel.count("/") != 1:
            continue
        resolved = Path(os.path.realpath(under(root, f"{host_base}/{rel}")))
        try:
            real_rel = resolved.relative_to(under(root, host_base).resolve()).as_posix()
        except ValueError:
            continue  # points outside the driver root: not ours to link
        if real_rel in regular and real_rel.startswith("lib64/"):
            name = Path(rel).name
            names += [name, *(f"{n}={name}" for n in EXTRA_NAMES.get(name, ()))]
    if names:
        mounts.insert(0, _mount(f"{host_base}/lib64", f"{host_base}/lib64"))
    return mounts, names


def find_nvidia_cdi_hook(root: Path, configured: str | None = None) -> str | None:
    """Where nvidia-cdi-hook is on the node: `configured` (runtime.cdi_hook_path) when that file
    exists, else the first TOOL_DIRS entry holding it; None when it is not there."""
    for path in [configured] if configured else [f"{d}/{CDI_HOOK}" for d in TOOL_DIRS]:
        try:
            if under(root, path).is_file():
                return path
        except NodeprepError:  # the image's links cannot be resolved: not there
            continue
    return None


def ipc_mounts(dev_root: Path) -> list[dict[str, Any]]:
    """The daemons' sockets and the MPS pipe directory that exist under `dev_root`."""
    out = []
    for path in IPC_PATHS:
        try:
            present = under(dev_root, path).exists()
        except NodeprepError:
            present = False
        if present:
            out.append({"hostPath": path, "containerPath": path, "options": list(IPC_OPTIONS)})
    return out


def caps_nodes(dev_root: Path) -> list[dict[str, str]]:
    """/dev/nvidia-caps/nvidia-cap* (MIG GPU and compute instance access) present under `dev_root`."""
    try:
        caps = under(dev_root, CAPS_DIR)
        names = [p.name for p in caps.iterdir() if p.name.removeprefix("nvidia-cap").isdigit()
                 and p.name.isascii()]  # the driver's names only, whatever else an image holds
    except (NodeprepError, OSError):
        return []
    return [{"path": f"{CAPS_DIR}/{n}"} for n in sorted(names, key=lambda n: (len(n), n))]  # cap2 < cap12


def _mount(host: str, container: str) -> dict[str, Any]:
    return {"hostPath": host, "containerPath": container, "options": list(MOUNT_OPTIONS)}


def build_spec(root: Path, driver: Driver, gpus: GpuList, *, version: str | None = None,
               dev_root: Path | None = None, nvidia_cdi_hook_path: str | None = None) -> dict[str, Any]:
    """The CDI spec as data (pure apart from reading the driver root under `root` and what exists
    under `dev_root`, default `root`: device nodes, daemon sockets, the driver's params file)."""
    version = version or active_driver(root)
    dev_root = root if dev_root is None else dev_root
    manifest = load_driver_manifest(root, version)
    if not gpus.gpus:
        raise StateError(
            "no NVIDIA GPUs found (nvidia-smi, /proc/driver/nvidia, PCI sysfs): not writing a CDI spec",
            hint="is the driver loaded? run `nodeprep doctor`",
        )
    common_nodes = [{"path": "/dev/nvidiactl"}]
    if "nvidia-uvm" in driver.modules:
        common_nodes += [{"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidia-uvm-tools"}]
    if "nvidia-modeset" in driver.modules or _exists(dev_root, "/dev/nvidia-modeset"):
        common_nodes.append({"path": "/dev/nvidia-modeset"})
    lib_dir = LIB_DIRS.get(manifest.arch, LIB_DIRS["amd64"])
    nvidia_cdi_hook = find_nvidia_cdi_hook(root, nvidia_cdi_hook_path)
    mounts, links = _mounts(root, version, manifest)
    edits: dict[str, Any] = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": common_nodes,
        "mounts": mounts + ipc_mounts(dev_root),
    }
    edits["hooks"] = spec_hooks(version, lib_dir, nvidia_cdi_hook, links, params=_exists(dev_root, PARAMS))
    devices: list[dict[str, Any]] = []
    for g in gpus.gpus:
        node = {"deviceNodes": [{"path": f"/dev/nvidia{g.minor}"}]}
        devices.append({"name": str(g.index), "containerEdits": node})
        if g.uuid:
            devices.append({"name": g.uuid, "containerEdits": json.loads(json.dumps(node))})
    all_nodes = [{"path": f"/dev/nvidia{g.minor}"} for g in gpus.gpus] + caps_nodes(dev_root)
    devices.append({"name": "all", "containerEdits": {"deviceNodes": all_nodes}})
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices, "containerEdits": edits}


def spec_hooks(version: str, lib_dir: str, nvidia_cdi_hook: str | None, links: list[str], *,
          params: bool = False) -> list[dict[str, Any]]:
    """createContainer hooks (pure). nodeprep's own, always: the requirement check, the `links`
    (`--link` values: NAME or NAME=ENTRY of the versioned lib64/ folder the spec mounts) made in the
    image's loader default directory, the ld cache rebuilt only when shadowed. With nvidia-cdi-hook
    (`nvidia_cdi_hook`, its path on the node), what only NVIDIA's does: `enable-cuda-compat` (the image's
    CUDA forward-compatibility libraries when newer than the driver), run by nodeprep's hook
    (`--nvidia-cdi-hook`) only for an image that has such libraries, before its ld cache check (which
    so also sees the compat folder `enable-cuda-compat` added), and, on a node with the driver's
    params file, `disable-device-node-modification`, which nodeprep's hook becomes when done (exec:
    one hook process for the runtime to start, not two). NVIDIA's `create-symlinks` is not used
    (nodeprep's hook makes every link) nor its `update-ldcache` (an ldconfig run on every start): the
    links are in the loaders' default directories."""
    path, argv, env = hook_command()
    ours: dict[str, Any] = {"hookName": "createContainer", "path": path,
                            "args": [*argv, "--driver", version, "--ldconfig", lib_dir]}
    if nvidia_cdi_hook:
        ours["args"] += ["--nvidia-cdi-hook", nvidia_cdi_hook]
        ours["args"] += ["--disable-device-node-modification"] if params else []
    if links:
        ours["args"] += ["--libraries", f"{DRIVER_BASE}/{version}/lib64",
                         *(a for link in links for a in ("--link", link))]
    return [{**ours, "env": env} if env else ours]


def nvidia_cdi_hook_of(spec: dict[str, Any]) -> str | None:
    """The nvidia-cdi-hook a spec `hooks` wrote names (pure; None: none)."""
    for h in (spec.get("containerEdits") or {}).get("hooks") or []:
        args = h.get("args") or []
        if args[:1] == [CDI_HOOK]:
            return str(h.get("path"))
        if h.get("path") == hook_command()[0] and "--nvidia-cdi-hook" in args[:-1]:
            return str(args[args.index("--nvidia-cdi-hook") + 1])
    return None


def library_links(spec: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """(the library folder, {name: folder entry}) nodeprep's hook links in a spec `hooks` wrote (pure;
    (None, {}) for a spec without them)."""
    for h in (spec.get("containerEdits") or {}).get("hooks") or []:
        args = h.get("args") or []
        if h.get("path") == hook_command()[0] and "--libraries" in args:
            pairs = [args[i + 1].partition("=") for i, a in enumerate(args[:-1]) if a == "--link"]
            return args[args.index("--libraries") + 1], {n: e or n for n, _, e in pairs}
    return None, {}


def _exists(root: Path, path: str) -> bool:
    try:
        return os.path.lexists(under(root, path, follow_last=False))
    except NodeprepError:
        return False


def _edits_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices", []) if isinstance(d, dict)]
    return [e for e in edits if isinstance(e, dict)]


def cdi_features(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(minimum cdiVersion, feature) for every versioned feature `spec` uses (pure; from SPEC.md's
    version history)."""
    found: list[tuple[str, str]] = []
    devices = [d for d in spec.get("devices", []) if isinstance(d, dict)]
    edits = _edits_of(spec)
    if any(m.get("type") for e in edits for m in e.get("mounts", []) if isinstance(m, dict)):
        found.append(("0.4.0", "mounts[].type"))
    if any(str(d.get("name", ""))[:1].isdigit() for d in devices):
        found.append(("0.5.0", "device names starting with a digit"))
    if any(n.get("hostPath") for e in edits for n in e.get("deviceNodes", []) if isinstance(n, dict)):
        found.append(("0.5.0", "deviceNodes[].hostPath"))
    if spec.get("annotations") or any(d.get("annotations") for d in devices):
        found.append(("0.6.0", "annotations"))
    if "." in str(spec.get("kind", "")).partition("/")[2]:
        found.append(("0.6.0", "'.' in the kind's class"))
    if any(e.get("intelRdt") for e in edits):
        found.append(("0.7.0", "intelRdt"))
    if any(e.get("additionalGids") for e in edits):
        found.append(("0.7.0", "additionalGids"))
    if any(e.get("netDevices") for e in edits):
        found.append(("1.1.0", "netDevices"))
    rdt = [e["intelRdt"] for e in edits if isinstance(e.get("intelRdt"), dict)]
    if any("schemata" in r or r.get("enableMonitoring") for r in rdt):
        found.append(("1.1.0", "intelRdt.schemata/enableMonitoring"))
    return found


def cdi_version_problems(spec: dict[str, Any]) -> list[str]:
    """Problems of the declared cdiVersion: unknown, or older than a feature the spec uses."""
    declared = spec.get("cdiVersion")
    if declared not in CDI_VERSIONS:
        return [f"cdiVersion: {declared!r} is not a released CDI version ({', '.join(CDI_VERSIONS)})"]
    rank = CDI_VERSIONS.index
    return [
        f"cdiVersion: {feature} needs cdiVersion >= {needed}, the spec declares {declared}"
        for needed, feature in cdi_features(spec)
        if rank(needed) > rank(declared)
    ]


def spec_problems(spec: Any) -> list[str]:
    """Schema problems (`path: message`), [] when `spec` is a valid CDI spec."""
    import jsonschema  # ~20 ms to import; only a spec being written or checked needs it

    schema = json.loads(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft7Validator(schema)
    out = []
    for err in sorted(validator.iter_errors(spec), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(top)"
        out.append(f"{where}: {err.message}")
    names = [d.get("name") for d in spec.get("devices", [])] if isinstance(spec, dict) else []
    dupes = sorted({n for n in names if names.count(n) > 1})
    out += [f"devices: name {n!r} is used more than once" for n in dupes]
    if isinstance(spec, dict) and not any(p.startswith("cdiVersion") for p in out):
        out += cdi_version_problems(spec)
    return out


def spec_target(runtime: Runtime) -> str:
    spec_dir = "/etc/cdi" if "/etc/cdi" in runtime.cdi_spec_dirs else runtime.cdi_spec_dirs[0]
    return f"{spec_dir}/{SPEC_NAME}"


def render_spec(spec: dict[str, Any], *, on_disk: bytes | None = None) -> bytes:
    """The spec file's bytes, checked against the CDI schema unless they are exactly `on_disk` (the
    file already there, checked when it was written): every spec that gets written is checked,
    and a re-run that changes nothing does not load the schema validator."""
    header = "# Written by nodeprep from the active driver root; rewritten on every join/activation.\n"
    content = (header + yaml.safe_dump(spec, sort_keys=False, default_flow_style=False)).encode()
    if content != on_disk:
        problems = spec_problems(spec)
        if problems:  # a bug in build_spec, not bad input
            raise StateError("generated CDI spec is invalid: " + "; ".join(problems))
    return content


def _read_if_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def plan_cdi(root: Path, driver: Driver, runtime: Runtime, gpus: GpuList, *,
             dev_root: Path | None = None) -> list[FileChange]:
    """The CDI spec file change ([] when runtime.cdi is off)."""
    if not runtime.cdi:
        return []
    target = spec_target(runtime)
    path = under(root, target)
    spec = build_spec(root, driver, gpus, dev_root=dev_root, nvidia_cdi_hook_path=runtime.cdi_hook_path)
    content = render_spec(spec, on_disk=_read_if_file(path))
    problem = python_problem(root)
    if problem:
        raise StateError(problem, hint="install python3 on the node (the image), or set runtime.cdi false; "
                         "nothing was changed")
    return [*hook_program(root), FileChange(path, target, content, 0o644)]


SPEC_HEADER = b"# Written by nodeprep"
SPEC_LOCATIONS = ("/etc/cdi", "/run/cdi")  # /var/run is a link to /run (absolute in images)


def _devices_from_spec(spec: dict[str, Any]) -> GpuList:
    """The GPU list a nodeprep spec was written for (index and UUID entries name the same node)."""
    by_node: dict[str, dict[str, Any]] = {}
    for dev in spec.get("devices", []):
        name = str(dev.get("name"))
        nodes = dev.get("containerEdits", {}).get("deviceNodes", [])
        if name == "all" or len(nodes) != 1:
            continue
        entry = by_node.setdefault(nodes[0]["path"], {})
        entry["index" if name.isdigit() else "uuid"] = int(name) if name.isdigit() else name
    found = []
    for path, entry in by_node.items():
        minor = path.removeprefix("/dev/nvidia")
        if "index" in entry and minor.isdigit():
            found.append(GpuDevice(index=entry["index"], minor=int(minor), uuid=entry.get("uuid")))
    return GpuList(source="cdi-spec", gpus=tuple(sorted(found, key=lambda g: g.index)))


def _our_specs(root: Path) -> list[tuple[str, Path, bytes]]:
    """(target, path, bytes) of the specs nodeprep wrote, in SPEC_LOCATIONS under `root`."""
    found = []
    for spec_dir in SPEC_LOCATIONS:
        target = f"{spec_dir}/{SPEC_NAME}"
        try:
            path = under(root, target)
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except StateError as e:  # the location leaves --root through a link: not ours to touch
            log.info("not refreshing %s: %s", target, e)
            continue
        if raw.startswith(SPEC_HEADER):
            found.append((target, path, raw))
    return found


def refresh_problem(root: Path) -> str | None:
    """Why activation could not rewrite a spec nodeprep wrote, or the hook program it names
    (checked before anything changes)."""
    specs = _our_specs(root)
    for change in hook_program(root) if specs else []:
        if change.changed:
            problem = writable_problem(change.path, change.target)
            if problem:
                return problem
    for target, path, _ in specs:
        problem = writable_problem(path, target)
        if problem:
            return problem
    return None


def refresh_after_activation(root: Path, version: str) -> list[str]:
    """Rewrite the CDI specs nodeprep wrote so their mounts name the newly active `version`.

    The spec mounts files of one versioned root (/opt/nvidia/<version>), so every switch of
    /opt/nvidia/current must rewrite it; its GPU list and device nodes are kept. Specs not written
    by nodeprep are left alone; the hook program they name is rewritten first when this nodeprep's
    differs (hookprogram.py). Returns the node paths of the specs rewritten.
    """
    rewritten = []
    specs = _our_specs(root)
    for change in hook_program(root) if specs else []:  # the modules first: the program loads them
        if change.changed:  # a nodeprep upgrade: the spec names this program
            atomic_write(change.path, change.content, mode=change.mode)
            log.info("rewrote %s (nodeprep's CDI hook)", change.target)
    for target, path, raw in specs:
        old = yaml.safe_load(raw)
        nodes = {n["path"] for n in old.get("containerEdits", {}).get("deviceNodes", [])}
        modules = ("nvidia",) + (("nvidia-uvm",) if "/dev/nvidia-uvm" in nodes else ()) + (
            ("nvidia-modeset",) if "/dev/nvidia-modeset" in nodes else ())
        configured = nvidia_cdi_hook_of(old)
        spec = build_spec(root, Driver(version=version, modules=modules), _devices_from_spec(old),
                          version=version, nvidia_cdi_hook_path=configured)
        change = FileChange(path, target, render_spec(spec, on_disk=raw), 0o644)
        if change.changed:
            atomic_write(path, change.content, mode=change.mode)
            rewritten.append(target)
    return rewritten
