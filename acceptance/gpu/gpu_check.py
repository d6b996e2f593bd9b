"""The checks of acceptance/gpu/gpu-check.sh against the live NVIDIA driver (run by it, in its temp venv,
with PYTHONPATH at this checkout). Reads the system, writes only under --work. Prints one line per
check and a closing summary; exit 0 when every check passed, 1 when one failed.

1. labels   GPU labels from NVML (`nodeprep labels --source nvml`) and from nvidia-smi
            (`--source nvidia-smi`, and from a `nvidia-smi -q -x` capture) agree
2. versions the loaded kernel module, NVML, nvidia-smi and libnvidia-ml.so.1 name one driver version;
            nvidia-smi's CUDA version is the one nodeprep's table gives for that driver
3. doctor   `nodeprep doctor` on / (gpu + device nodes; every check when nodeprep installed the driver)
   health   `nodeprep health --json` (read only: NVML, its events for half a second, the kernel log):
            every GPU healthy (docs/node.md "GPU health after the join"); and `nodeprep health --watch`
            (read only) at most 30 MB resident after 10 s at rest on the real NVML
4. cdi      the CDI spec generated from the live driver's libraries (mirrored into a driver root under
            --work) is valid against the CDI schema, and its mounts and device nodes exist
With --nvidia-bin DIR (NVIDIA's binaries, plain or NAME.zst / NAME.xz, as NODEPREP_NVIDIA_BIN has them):
5. gfd       `gpu-feature-discovery --oneshot` and `nodeprep labels` give the same nvidia.com labels
             but for the documented keys (GFD_ONLY, NODEPREP_ONLY; docs/labels.md)
6. ctk       `nvidia-ctk cdi generate` for the live driver beside nodeprep's spec of check 4: the
             differences (device names, device nodes, mounted files, hooks) listed below the line
7. validator the GPU Operator's `nvidia-validator -c driver` against the mirrored root with nodeprep's
             stable entry points (nodeprep.node.entrypoints), chrooted as in its container (root at
             /host): it must find and run the root's nvidia-smi ("Detected a pre-installed driver")
With --containers (root, podman and nvcc on PATH):
8. containers podman starts on the GPU through nodeprep's spec, the CUDA gate and NVIDIA's spec
             (acceptance/gpu/gpu_containers.py: what it checks and measures)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nodeprep import cuda, runner
from nodeprep.artifact import MANIFEST, FileEntry, Manifest
from nodeprep.digests import sha256_file
from nodeprep.labels.system import os_release
from nodeprep.node import entrypoints
from nodeprep.node.doctor import loaded_version
from nodeprep.node.layout import Layout
from nodeprep.profile import Driver
from nodeprep.runtime import cdi
from nodeprep.runtime import gpus as gpumod

# Labels one source can give and the other cannot (nvidia-smi -q -x has no compute capability, so
# no compute.* and no family derived from it), and labels naming the source itself.
ONLY_NVML = {"nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor", "nvidia.com/gpu.family"}
IGNORED = {"nodeprep.dev/gpu-source"}
USERSPACE_LIB = re.compile(r"^lib(?:cuda|nvidia-[a-z0-9-]+|nvcuvid|nvoptix)\.so\.(\d+\.\d+(?:\.\d+)?)$")
# nvidia.com keys one side sets on purpose (docs/labels.md): GFD's run timestamp and NVLink clique;
# nodeprep's own gpu.present
GFD_ONLY = {"nvidia.com/gfd.timestamp", "nvidia.com/gpu.clique"}
NODEPREP_ONLY = {"nvidia.com/gpu.present"}
DETECTED = "Detected a pre-installed driver on the host"
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.count = 0

    def line(self, name: str, ok: bool | None, message: str) -> None:
        """ok None: a note (WARN), not a failure."""
        self.count += ok is not None
        word = "WARN" if ok is None else ("OK" if ok else "FAIL")
        if ok is False:
            self.failed.append(name)
        print(f"gpu-check: {name:<9} {word:<4} {message}", flush=True)


def nvidia_smi(*args: str) -> str:
    """Output of the live nvidia-smi (found on this process's PATH, as nodeprep finds it)."""
    tool = runner.which("nvidia-smi")
    if tool is None:
        raise SystemExit("gpu-check: nvidia-smi is not on PATH")
    return runner.run([tool, *args], timeout=60).stdout


def nodeprep(*args: str) -> runner.Result:
    return runner.run([sys.executable, "-c", "from nodeprep.cli import main; main()", *args], check=False,
                      timeout=120, inherit_env=True)


def labels_from(*args: str) -> tuple[dict[str, Any] | None, str]:
    r = nodeprep("labels", "--cloud", "none", "--json", *args)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["(no output)"])[0]
    return json.loads(r.stdout), ""


def compare_labels(a: dict[str, str], b: dict[str, str], *, only_a: set[str]) -> list[str]:
    """Differences between two label sets (nvidia.com/* and nodeprep.dev/*), allowing `only_a` keys."""
    keys = {k for k in {*a, *b} if k not in IGNORED}
    out = []
    for k in sorted(keys):
        if k in a and k in b:
            if a[k] != b[k]:
                out.append(f"{k}: {a[k]!r} != {b[k]!r}")
        elif k in a and k not in only_a:
            out.append(f"{k}: only in the first ({a[k]!r})")
        elif k in b:
            out.append(f"{k}: only in the second ({b[k]!r})")
    return out


def check_labels(report: Report, work: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(labels --json through NVML, through nvidia-smi); None for a source that failed."""
    xml = work / "nvidia-smi.xml"
    xml.write_text(nvidia_smi("-q", "-x"))
    nvml, why_nvml = labels_from("--source", "nvml")
    smi, why_smi = labels_from("--source", "nvidia-smi")
    cap, why_cap = labels_from("--nvidia-smi-xml", str(xml))
    if nvml is None or smi is None or cap is None:
        report.line("labels", False, "; ".join(w for w in (why_nvml, why_smi, why_cap) if w))
        return nvml, smi
    (work / "labels-nvml.json").write_text(json.dumps(nvml, indent=2))
    (work / "labels-nvidia-smi.json").write_text(json.dumps(smi, indent=2))
    diff = compare_labels(nvml["labels"], smi["labels"], only_a=ONLY_NVML)
    diff += [f"live vs capture: {d}" for d in compare_labels(smi["labels"], cap["labels"], only_a=set())]
    gpu = {k: v for k, v in nvml["labels"].items() if k.startswith("nvidia.com/")}
    report.line("labels", not diff, "; ".join(diff) if diff else
                f"NVML and nvidia-smi agree on {len(gpu)} nvidia.com labels "
                f"({gpu.get('nvidia.com/gpu.count')} x {gpu.get('nvidia.com/gpu.product')})")
    return nvml, smi


def userspace_libs() -> dict[str, Path]:
    """Real files of the driver's user-space libraries the ld cache knows: {file name: path}."""
    out = runner.run(["ldconfig", "-p"], timeout=60).stdout
    libs: dict[str, Path] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)$", line)
        if not m or "x86-64" not in m.group(2) and "64" not in m.group(2):
            continue
        real = Path(os.path.realpath(m.group(3)))
        if USERSPACE_LIB.match(real.name) and real.is_file():
            libs[real.name] = real
    return libs


def check_versions(report: Report, nvml: dict[str, Any] | None, smi_labels: dict[str, Any] | None,
                   libs: dict[str, Path]) -> str | None:
    module = loaded_version(Path("/"))
    smi = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader").split()
    seen = {"kernel module": module, "nvidia-smi": smi[0] if smi else None}
    if nvml is not None:
        seen["NVML"] = (nvml.get("facts", {}).get("gpu") or {}).get("driver_version")
    ml = [n for n in libs if n.startswith("libnvidia-ml.so.")]
    seen["libnvidia-ml.so.1"] = ml[0].removeprefix("libnvidia-ml.so.") if ml else None
    versions = set(seen.values())
    ok = len(versions) == 1 and None not in versions
    report.line("versions", ok, ", ".join(f"{k} {v}" for k, v in seen.items()))
    driver = module if ok else None
    source, facts = ("NVML", nvml) if nvml is not None else ("nvidia-smi", smi_labels)
    if driver and facts is not None:
        got = (facts.get("facts", {}).get("gpu") or {}).get("cuda_version")
        got_s = ".".join(str(x) for x in got) if got else None
        table = cuda.max_cuda(driver)
        message = f"driver {driver}: CUDA {got_s} ({source}), nodeprep/cuda.py's table says {table}"
        if table is None or got_s is None:
            report.line("cuda", False, message)
        elif cuda.vkey(table) < cuda.vkey(got_s):  # a CUDA release newer than the table: it is behind
            report.line("cuda", None, message + ": add the newer CUDA release to the table")
        else:  # the table claiming more than the driver runs would be a wrong `doctor --require-cuda`
            report.line("cuda", table == got_s, message)
    return driver


def check_doctor(report: Report, driver: str | None) -> None:
    nodeprep_driver = Path("/opt/nvidia/current").is_symlink()
    args = ["doctor", "--root", "/", "--json"]
    if not nodeprep_driver:  # a driver nodeprep did not install: the checks that do not need its state
        args += ["--check", "gpu", "--check", "devices"]
    elif driver and cuda.max_cuda(driver):
        args += ["--require-cuda", str(cuda.max_cuda(driver))]
    r = nodeprep(*args)
    try:
        data = json.loads(r.stdout)
    except ValueError:
        report.line("doctor", False, f"exit {r.returncode}: {r.stderr.strip()[:300]}")
        return
    checks = data.get("checks", [])
    summary = "; ".join(f"{c['name']}: {c['message']}" for c in checks)
    scope = "all checks" if nodeprep_driver else "gpu, devices (driver not installed by nodeprep)"
    report.line("doctor", r.returncode == 0 and bool(checks) and all(c["ok"] for c in checks),
                f"[{scope}] {summary}")


def check_health(report: Report) -> None:
    """The GPU health verdict of this machine, read only (nothing is written to a cluster)."""
    r = nodeprep("health", "--json")
    try:
        data = json.loads(r.stdout)
    except ValueError:
        report.line("health", False, f"exit {r.returncode}: {r.stderr.strip()[:300]}")
        return
    gpus = data.get("gpus", [])
    cond = data.get("condition", {})
    names = ", ".join(f"GPU {g['index']} ({g['uuid']}, {g['pci']})" for g in gpus)
    message = (f"{len(gpus)} GPU(s) healthy: {names}" if data.get("healthy")
               else f"{cond.get('reason')}: {cond.get('message')}")
    notes = "; ".join(data.get("notes", []))
    healthy = r.returncode == 0 and bool(data.get("healthy")) and bool(gpus)
    report.line("health", healthy, message + (f" (notes: {notes})" if notes else ""))
    if healthy:  # the service's cost at rest means something only where NVML answers
        report.line("health-rss", *health_rss())


def health_rss(rest: float = 10.0) -> tuple[bool, str]:
    """The resident memory of `nodeprep health --watch` at rest on this machine's real NVML (read only:
    no --apply, nothing written anywhere), against issue 37's goal of 30 MB; bench/health.py measures it
    on NVIDIA's NVML mock, whose Go runtime a real libnvidia-ml does not have."""
    argv = [sys.executable, "-c", "from nodeprep.cli import main; main()", "health", "--watch", "--interval",
            "5"]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            time.sleep(rest)
            status = Path(f"/proc/{proc.pid}/status").read_text() if proc.poll() is None else ""
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    m = re.search(r"VmRSS:\s+(\d+)", status)
    if m is None:
        return False, f"`nodeprep health --watch` exited ({proc.returncode}) before {rest:.0f} s"
    mb = int(m.group(1)) / 1000
    return mb <= 30.0, f"{mb:.1f} MB resident after {rest:.0f} s at rest (goal <= 30 MB)"


def mirror_driver_root(root: Path, version: str, libs: dict[str, Path]) -> int:
    """ROOT/opt/nvidia/<version> with copies of the live driver's libraries (lib64/, their soname
    links) and tools (bin/), a userspace manifest, and ROOT/opt/nvidia/current -> <version>: what
    cdi.build_spec reads. Copies, not links: a driver root must not lead outside itself."""
    base = root / "opt" / "nvidia" / version
    (base / "lib64").mkdir(parents=True)
    (base / "bin").mkdir()
    files: dict[str, FileEntry] = {}
    for name, real in sorted(libs.items()):
        if not name.endswith(f".so.{version}"):
            continue
        shutil.copy2(real, base / "lib64" / name)
        files[f"lib64/{name}"] = FileEntry(sha256_file(real), real.stat().st_size, 0o755)
        soname = runner.run(["objdump", "-p", real], timeout=60, check=False).stdout
        m = re.search(r"SONAME\s+(\S+)", soname)
        if m and m.group(1) != name:
            (base / "lib64" / m.group(1)).symlink_to(name)
    for tool in BINARIES:
        found = runner.which(tool)
        if found:
            real = Path(os.path.realpath(found))
            shutil.copy2(real, base / "bin" / tool)
            files[f"bin/{tool}"] = FileEntry(sha256_file(real), real.stat().st_size, 0o755)
    rel = os_release(Path("/"))
    manifest = Manifest(kind="userspace", driver_version=version, arch="amd64",
                        os=f"{rel.get('ID', 'linux')}-{rel.get('VERSION_ID', '')}", input_digest="0" * 64,
                        inputs={}, files=files, extra={"gpu_check": "mirror of the live driver"})
    (base / MANIFEST).write_bytes(manifest.to_json())
    (root / "opt" / "nvidia" / "current").symlink_to(version)
    return len(files)


def node_root(work: Path) -> Path:
    """The mirrored driver root: ROOT = CTR/host, CTR being the validator's container (check 7)."""
    return work / "ctr" / "host"


def check_cdi(report: Report, work: Path, driver: str | None, libs: dict[str, Path]) -> dict[str, Any] | None:
    """Check 4; returns nodeprep's spec (None when none was generated)."""
    if driver is None:
        report.line("cdi", False, "not generated: the driver versions disagree (see versions)")
        return None
    root = node_root(work)
    mirrored = mirror_driver_root(root, driver, libs)
    gpus = gpumod.discover(Path("/"))
    # the spec lists the device nodes of the modules the node loads: here, those loaded now
    loaded = tuple(m for m in Driver(version=driver).modules
                   if Path("/sys/module", m.replace("-", "_")).is_dir())
    spec = cdi.build_spec(root, Driver(version=driver, modules=loaded), gpus, version=driver)
    (work / "nvidia.yaml").write_bytes(cdi.render_spec(spec))
    problems = cdi.spec_problems(spec)
    base = f"/opt/nvidia/{driver}/"
    mounts = spec["containerEdits"]["mounts"]
    missing = []  # a mounted library that is not, byte for byte, the live driver's file of its name
    folder, links = cdi.library_links(spec)  # the lib64 folder, mounted once; the hook links the names
    for entry in sorted(set(links.values())):
        copy = Path(os.path.realpath(root / f"{folder}/{entry}".lstrip("/")))
        if copy.name not in libs or sha256_file(copy) != sha256_file(libs[copy.name]):
            missing.append(f"{folder}/{entry}")
    nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    nodes += [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    absent = sorted({n for n in nodes if not os.path.exists(n)})
    libcuda = [n for n in links if n == "libcuda.so.1"]
    bad = [*problems, *(f"mount source is no live driver file: {p}" for p in missing),
           *(f"no device node {n}" for n in absent)]
    if not libcuda:
        bad.append("no libcuda.so.1 link")
    report.line("cdi", not bad, "; ".join(bad[:5]) if bad else
                f"valid CDI {spec['cdiVersion']} spec from {mirrored} live driver files "
                f"({len(mounts)} mounts under {base}, {len(spec['devices'])} devices, "
                f"gpu facts: {gpus.source})")
    return spec


# ---------------------------------------------------------------------------------------------
# With NVIDIA's binaries (--nvidia-bin)


def nvidia_binary(src: Path, work: Path, name: str) -> Path | None:
    """NAME from `src`, plain or NAME.zst / NAME.xz (decompressed into WORK/nvidia-bin); None if absent."""
    plain = src / name
    if plain.is_file():
        return plain
    out = work / "nvidia-bin" / name
    out.parent.mkdir(exist_ok=True)
    if (src / f"{name}.zst").is_file():
        import zstandard

        with (src / f"{name}.zst").open("rb") as fin, out.open("wb") as fout:
            zstandard.ZstdDecompressor(max_window_size=1 << 31).copy_stream(fin, fout)
    elif (src / f"{name}.xz").is_file():
        import lzma

        with lzma.open(src / f"{name}.xz") as fin, out.open("wb") as fout:
            shutil.copyfileobj(fin, fout)
    else:
        return None
    out.chmod(0o755)
    return out


def first_line(r: runner.Result) -> str:
    text = (r.stderr.strip() or r.stdout.strip()).splitlines()
    return f"exit {r.returncode}: {text[-1][:300] if text else '(no output)'}"


def ran_beside(report: Report, check: str, name: str, tool: Path | None, ours: dict[str, Any] | None,
               ours_failed: str, args: list[str | Path], shown: int, out: Path) -> dict[str, Any] | None:
    """nodeprep's result `ours` once NVIDIA's `tool` (`name` in --nvidia-bin) ran with `args` and wrote
    `out`, to compare the two; None where either is missing or the tool failed, the check's FAIL line
    reported (`ours_failed` where nodeprep's result is missing; a failed run named by its first `shown`
    arguments)."""
    if tool is None or ours is None:
        report.line(check, False, f"no {name} in --nvidia-bin" if tool is None else ours_failed)
        return None
    r = runner.run([tool, *args], timeout=120, check=False)
    if r.returncode != 0 or not out.is_file():
        report.line(check, False, f"{name} {' '.join(map(str, args[:shown]))} {first_line(r)}")
        return None
    return ours


def check_gfd(report: Report, work: Path, gfd: Path | None, ours: dict[str, Any] | None) -> None:
    """GFD --oneshot (driver root /) against nodeprep's labels of check 1 (NVML, else nvidia-smi)."""
    out = work / "gfd.labels"
    ours = ran_beside(report, "gfd", "gpu-feature-discovery", gfd, ours,
                      "nodeprep labels failed (see labels)",
                      ["--oneshot", "--use-node-feature-api=false", "-o", out], 1, out)
    if ours is None:
        return
    theirs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    mine = {k: v for k, v in ours["labels"].items() if k.startswith("nvidia.com/")}
    diff = compare_labels({k: v for k, v in theirs.items() if k not in GFD_ONLY},
                          {k: v for k, v in mine.items() if k not in NODEPREP_ONLY}, only_a=set())
    diff = [d.replace("the first", "GFD").replace("the second", "nodeprep") for d in diff]
    same = len(set(theirs) & set(mine))
    report.line("gfd", not diff, "; ".join(diff) if diff else
                f"GFD and nodeprep agree on {same} nvidia.com labels (GFD only, as documented: "
                f"{', '.join(sorted(k for k in theirs if k in GFD_ONLY)) or 'none'}; nodeprep only: "
                f"{', '.join(sorted(k for k in mine if k in NODEPREP_ONLY)) or 'none'})")


def spec_summary(spec: dict[str, Any]) -> dict[str, set[str]]:
    """What two CDI specs are compared by: device names, device nodes, mounted files, hooks."""
    edits = [spec.get("containerEdits") or {},
             *((d.get("containerEdits") or {}) for d in spec.get("devices", []))]
    hooks = set()
    for e in edits:
        for h in e.get("hooks") or []:
            words = [a for a in (h.get("args") or [])[1:] if re.fullmatch(r"[a-z][a-z-]*[a-z]", a)][:1]
            hooks.add(f"{h.get('hookName')}:{os.path.basename(h.get('path', ''))}"
                      + (f" {words[0]}" if words else ""))
    return {
        "device": {str(d.get("name")) for d in spec.get("devices", [])},
        "node": {n["path"] for e in edits for n in e.get("deviceNodes") or []},
        "file": {os.path.basename(m["containerPath"]) for e in edits for m in e.get("mounts") or []},
        "hook": hooks,
    }


def check_ctk(report: Report, work: Path, ctk: Path | None, ours: dict[str, Any] | None) -> None:
    """nvidia-ctk's spec for the live driver (driver root /) beside nodeprep's: differences listed."""
    out = work / "nvidia-ctk.yaml"
    ours = ran_beside(report, "ctk", "nvidia-ctk", ctk, ours, "nodeprep's spec was not generated (see cdi)",
                      ["cdi", "generate", "--driver-root", "/", "--output", out], 2, out)
    if ours is None:
        return
    import yaml

    theirs = yaml.safe_load(out.read_text())
    a, b = spec_summary(theirs), spec_summary(ours)
    diffs = [(f"{kind}s only nvidia-ctk's spec has", sorted(a[kind] - b[kind])) for kind in a]
    diffs += [(f"{kind}s only nodeprep's spec has", sorted(b[kind] - a[kind])) for kind in a]
    diffs = [(what, items) for what, items in diffs if items]
    report.line("ctk", True, f"nvidia-ctk's CDI {theirs.get('cdiVersion')} spec: {len(a['device'])} devices, "
                f"{len(a['file'])} files, {len(a['hook'])} hooks; nodeprep's: {len(b['device'])}, "
                f"{len(b['file'])}, {len(b['hook'])}; " + (f"{len(diffs)} kinds of difference (below)"
                                                          if diffs else "no differences"))
    for what, items in diffs:
        print(f"    {what}: {', '.join(items)}", flush=True)


def ldd_libraries(binary: Path) -> list[Path]:
    """The shared objects the loader maps for `binary` (none for a static one or a script)."""
    out = runner.run(["ldd", binary], timeout=60, check=False).stdout
    return sorted({Path(w) for line in out.splitlines() for w in line.split() if w.startswith("/")})


def copy_libraries(root: Path, binary: Path) -> None:
    """The shared libraries `binary` needs into ROOT at their own paths (those ROOT has are kept)."""
    for lib in ldd_libraries(binary):
        target = root / str(lib).lstrip("/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), target)


def copy_into(root: Path, binary: Path, dest: str) -> None:
    """`binary` at ROOT/`dest` with the shared libraries it needs."""
    copy_libraries(root, binary)
    out = root / dest.lstrip("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, out)


def copy_device_nodes(root: Path, *, gpu: bool = True) -> list[str]:
    """ROOT/dev/null and (`gpu`) copies of the live /dev/nvidia* character devices (same numbers)."""
    (root / "dev").mkdir(exist_ok=True)
    nodes = ["/dev/null", *sorted(str(p) for p in Path("/dev").glob("nvidia*") if gpu and p.is_char_device())]
    for node in nodes:
        st = os.stat(node)
        os.mknod(root / node.lstrip("/"), stat.S_IFCHR | 0o666, st.st_rdev)
    return nodes[1:]


def check_validator(report: Report, work: Path, validator: Path | None, driver: str | None) -> None:
    """The validator, chrooted into CTR with the mirrored root at /host as in its DaemonSet."""
    root = node_root(work)
    if validator is None or driver is None or not (root / "opt/nvidia/current").is_symlink():
        report.line("validator", False, "no nvidia-validator in --nvidia-bin" if validator is None
                    else "no mirrored driver root (see cdi)")
        return
    ctr = root.parent
    layout = Layout(root)
    entrypoints.link(layout, driver)
    smi = root / "opt/nvidia" / driver / "bin/nvidia-smi"
    if smi.is_file():
        copy_libraries(root, smi)  # glibc, as any distribution has
    try:
        nodes = copy_device_nodes(root)
        copy_device_nodes(ctr, gpu=False)
    except OSError as e:
        report.line("validator", False, f"cannot make device nodes under {root} ({e.strerror}): needs root")
        return
    copy_into(ctr, validator, "/usr/bin/nvidia-validator")
    copy_into(ctr, Path(runner.which("chroot") or "/usr/sbin/chroot"), "/usr/bin/chroot")
    r = runner.run(["chroot", ctr, "/usr/bin/nvidia-validator", "-c", "driver", "--host-root", "/host",
                    "-o", "/validations", "--disable-dev-char-symlink-creation"], timeout=120, check=False)
    said = [line for line in (r.stdout + r.stderr).splitlines() if "driver" in line.lower()]
    found = next((line for line in said if DETECTED in line), None)
    links = ", ".join(sorted(entrypoints.planned(layout, driver)))
    if found:
        report.line("validator", True, f"nvidia-validator -c driver found and ran the root's nvidia-smi "
                    f"through nodeprep's entry points ({links}; {len(nodes)} device nodes)")
    else:
        report.line("validator", False, f"{first_line(r)}; " + " | ".join(x.strip()[:200] for x in said[:3]))


def check_containers(report: Report, work: Path, driver: str | None, nvidia: bool) -> None:
    """Check 8, scripts/gpu_containers.py over check 4's mirrored root; its lines printed as they come."""
    if driver is None or not (node_root(work) / "opt/nvidia/current").is_symlink():
        report.line("containers", False, "no mirrored driver root (see cdi)")
        return
    argv = [sys.executable, str(Path(__file__).with_name("gpu_containers.py")), "--work", str(work),
            "--driver", driver, *(["--nvidia-bin", str(work / "nvidia-bin")] if nvidia else [])]
    rc = subprocess.run(argv, timeout=900, check=False).returncode
    report.line("containers", rc == 0, "every start as expected (lines above)" if rc == 0 else
                f"exit {rc} (lines above)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="the temp directory (all writes go there)")
    ap.add_argument("--nvidia-bin", type=Path, help="NVIDIA's binaries: also checks 5-7")
    ap.add_argument("--containers", action="store_true", help="also check 8 (podman starts on the GPU)")
    args = ap.parse_args()
    report = Report()
    libs = userspace_libs()
    nvml, smi = check_labels(report, args.work)
    driver = check_versions(report, nvml, smi, libs)
    check_doctor(report, driver)
    check_health(report)
    spec = check_cdi(report, args.work, driver, libs)
    if args.nvidia_bin is not None:
        def binary(name: str) -> Path | None:
            return nvidia_binary(args.nvidia_bin, args.work, name)

        check_gfd(report, args.work, binary("gpu-feature-discovery"), nvml if nvml is not None else smi)
        check_ctk(report, args.work, binary("nvidia-ctk"), spec)
        check_validator(report, args.work, binary("nvidia-validator"), driver)
        binary("nvidia-cdi-hook")  # for check 8's spec of NVIDIA's form
    if args.containers:
        check_containers(report, args.work, driver, args.nvidia_bin is not None)
    if report.failed:
        print(f"gpu-check: {len(report.failed)} of {report.count} checks failed: {', '.join(report.failed)}")
        return 1
    print(f"gpu-check: all {report.count} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
