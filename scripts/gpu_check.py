"""The checks of scripts/gpu-check.sh against the live NVIDIA driver (run by it, in its temp venv,
with PYTHONPATH at this checkout). Reads the system, writes only under --work. Prints one line per
check and a closing summary; exit 0 when every check passed, 1 when one failed.

1. labels   GPU labels from NVML (`nodeprep labels --source nvml`) and from nvidia-smi
            (`--source nvidia-smi`, and from a `nvidia-smi -q -x` capture) agree
2. versions the loaded kernel module, NVML, nvidia-smi and libnvidia-ml.so.1 name one driver version;
            nvidia-smi's CUDA version is the one nodeprep's table gives for that driver
3. doctor   `nodeprep doctor` on / (gpu + device nodes; every check when nodeprep installed the driver)
4. cdi      the CDI spec generated from the live driver's libraries (mirrored into a driver root under
            --work) is valid against the CDI schema, and its mounts and device nodes exist
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from nodeprep import cuda, runner
from nodeprep.artifact import MANIFEST, FileEntry, Manifest, sha256_file
from nodeprep.join import cdi
from nodeprep.join import gpus as gpumod
from nodeprep.labels.system import os_release
from nodeprep.node.doctor import loaded_version
from nodeprep.profile import Driver

# Labels one source can give and the other cannot (nvidia-smi -q -x has no compute capability, so
# no compute.* and no family derived from it), and labels naming the source itself.
ONLY_NVML = {"nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor", "nvidia.com/gpu.family"}
IGNORED = {"nodeprep.dev/gpu-source"}
USERSPACE_LIB = re.compile(r"^lib(?:cuda|nvidia-[a-z0-9-]+|nvcuvid|nvoptix)\.so\.(\d+\.\d+(?:\.\d+)?)$")
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


def check_cdi(report: Report, work: Path, driver: str | None, libs: dict[str, Path]) -> None:
    if driver is None:
        report.line("cdi", False, "not generated: the driver versions disagree (see versions)")
        return
    root = work / "root"
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
    for m in mounts:
        copy = Path(os.path.realpath(root / m["hostPath"].lstrip("/")))
        if m["hostPath"].startswith(base + "lib64/") and (
                copy.name not in libs or sha256_file(copy) != sha256_file(libs[copy.name])):
            missing.append(m["hostPath"])
    nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    nodes += [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    absent = sorted({n for n in nodes if not os.path.exists(n)})
    libcuda = [m for m in mounts if m["containerPath"].endswith("/libcuda.so.1")]
    bad = [*problems, *(f"mount source is no live driver file: {p}" for p in missing),
           *(f"no device node {n}" for n in absent)]
    if not libcuda:
        bad.append("no libcuda.so.1 mount")
    report.line("cdi", not bad, "; ".join(bad[:5]) if bad else
                f"valid CDI {spec['cdiVersion']} spec from {mirrored} live driver files "
                f"({len(mounts)} mounts under {base}, {len(spec['devices'])} devices, "
                f"gpu facts: {gpus.source})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="the temp directory (all writes go there)")
    args = ap.parse_args()
    report = Report()
    libs = userspace_libs()
    nvml, smi = check_labels(report, args.work)
    driver = check_versions(report, nvml, smi, libs)
    check_doctor(report, driver)
    check_cdi(report, args.work, driver, libs)
    if report.failed:
        print(f"gpu-check: {len(report.failed)} of {report.count} checks failed: {', '.join(report.failed)}")
        return 1
    print(f"gpu-check: all {report.count} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
