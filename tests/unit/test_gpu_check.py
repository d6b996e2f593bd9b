"""The GPU acceptance tier (acceptance/gpu/, run as operators do through the wrapper scripts/gpu-check.sh)
on a machine without an NVIDIA GPU or driver (this one, CI): one clear `skipped` line, exit 3, nothing
written (not in its temp directory's parent, not in the checkout, not in HOME); end to end against a
simulated driver in a private mount namespace (see that test); on a machine with a GPU it runs for real
(docs/labels.md). The shell scripts (scripts/, acceptance/gpu/, and nodeprep/data/ for the node) pass
shellcheck (Debian's, scripts/deps/lint.apt)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fixtures import REPO

SCRIPT = REPO / "scripts" / "gpu-check.sh"  # the operators' path: a wrapper that execs the tier's home
HOME_DIR = REPO / "acceptance" / "gpu"
SHELL_SCRIPTS = [REPO / ".ci" / "run", *sorted((REPO / "scripts").glob("*.sh")),
                 *sorted(HOME_DIR.glob("*.sh")), *sorted((REPO / "nodeprep" / "data").glob("*.sh"))]


def tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.lstat().st_mtime_ns for p in path.rglob("*")
            if ".venv" not in p.parts and ".git" not in p.parts}


def gpu_check_module() -> Any:
    """acceptance/gpu/gpu_check.py loaded as a module (it is a script, not a package's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", HOME_DIR / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_skips_cleanly_without_a_gpu(tmp_path: Path) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver loaded: run scripts/gpu-check.sh itself")
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    home.mkdir()
    before = tree(REPO)
    env = {**os.environ, "TMPDIR": str(tmp), "HOME": str(home)}
    run = subprocess.run([str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stdout.startswith("gpu-check: skipped: no NVIDIA GPU/driver found (")
    assert len(run.stdout.splitlines()) == 1 and run.stderr == ""
    assert list(tmp.iterdir()) == [] and list(home.iterdir()) == []
    assert tree(REPO) == before
    bad = subprocess.run([str(SCRIPT), "--bogus"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: scripts/gpu-check.sh")


def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: run scripts/setup.sh (scripts/deps/lint.apt)")
    run = subprocess.run([shellcheck, *map(str, SHELL_SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert SCRIPT in SHELL_SCRIPTS and HOME_DIR / "gpu-check.sh" in SHELL_SCRIPTS


def test_scripts_holds_developer_tooling_and_a_wrapper() -> None:
    """scripts/ keeps the developer setup; the GPU tier's code is in acceptance/gpu/ (README.md there) and
    scripts/gpu-check.sh only execs it, passing its arguments on."""
    body = [ln for ln in SCRIPT.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert body == ['exec "$(dirname "$0")/../acceptance/gpu/gpu-check.sh" "$@"']
    assert not list((REPO / "scripts").glob("*.py"))
    assert (HOME_DIR / "README.md").is_file() and os.access(HOME_DIR / "gpu-check.sh", os.X_OK)


SIMULATE = r"""
set -e
mount -t tmpfs none /proc/driver
gpu=/proc/driver/nvidia/gpus/0000:01:00.0
mkdir -p $gpu
printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Fri Jun 16 2023\n' \
    > /proc/driver/nvidia/version
printf 'Model: \t\t NVIDIA A100-SXM4-80GB\nDevice Minor: \t 1\n' > $gpu/information
mount -t tmpfs none /sys/module
mkdir /sys/module/nvidia
echo 535.54.03 > /sys/module/nvidia/version
mount -t tmpfs none /sys/bus/pci/devices
mkdir /sys/bus/pci/devices/0000:01:00.0
echo 0x10de > /sys/bus/pci/devices/0000:01:00.0/vendor
echo 0x20b2 > /sys/bus/pci/devices/0000:01:00.0/device
echo 0x030200 > /sys/bus/pci/devices/0000:01:00.0/class
mount --bind "$SIM/ld.so.cache" /etc/ld.so.cache
exec "$@"
"""


def simulated_libraries(cc: str, sim: Path, tmp: Path, sources: dict[str, str]) -> dict[str, str]:
    """libcuda, libnvidia-ml and libnvidia-ptxjitcompiler of 535.54.03 compiled into SIM/libs with
    NVIDIA's sonames (each from SIM/`sources`[its name], else from a source of one symbol), and
    SIM/ld.so.cache listing them first; returns the environment the simulation runs the tier with."""
    (sim / "lib.c").write_text("int nodeprep_test_symbol(void) { return 1; }\n")
    for base in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{base}.so.1", "-o",
                        sim / "libs" / f"{base}.so.535.54.03", sim / sources.get(base, "lib.c")], check=True)
        (sim / "libs" / f"{base}.so.1").symlink_to(f"{base}.so.535.54.03")
    (sim / "ld.so.conf").write_text(f"{sim / 'libs'}\n" + Path("/etc/ld.so.conf").read_text())
    subprocess.run(["ldconfig", "-C", sim / "ld.so.cache", "-f", sim / "ld.so.conf"], check=True,
                   capture_output=True)
    return {**os.environ, "SIM": str(sim), "TMPDIR": str(tmp), "PYTHON": sys.executable,
            "PATH": f"{sim / 'bin'}:{os.environ['PATH']}"}


def test_runs_end_to_end_against_a_simulated_driver(tmp_path: Path, nvidia_smi_fixtures: Path) -> None:
    """Stand-ins for the GPU driver (the one boundary CI lacks), inside a private mount namespace so
    nothing outside it changes: /proc/driver/nvidia and /sys/module/nvidia say 535.54.03 is loaded,
    an NVIDIA PCI device is in sysfs, `nvidia-smi` on PATH answers with the recorded A100 capture, and
    the ld cache (bind-mounted over /etc/ld.so.cache) lists libraries compiled here with NVIDIA's
    sonames. NVML cannot start from such libraries and there are no /dev/nvidia* nodes, so `labels`,
    `doctor` (devices) and `cdi` (device nodes only) fail; the driver versions, the CUDA table, the
    GPU check and the CDI spec itself (schema, mounts byte for byte the live libraries) must pass.
    $PYTHON is this venv's interpreter (it has every package: no venv, no pip)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if os.geteuid() != 0 or not shutil.which("unshare") or cc is None:
        pytest.skip("needs root, unshare and a C compiler")
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver loaded: run scripts/gpu-check.sh itself")
    sim, tmp = tmp_path / "sim", tmp_path / "tmp"
    (sim / "bin").mkdir(parents=True)
    (sim / "libs").mkdir()
    tmp.mkdir()
    capture = nvidia_smi_fixtures / "a100-sxm4-80gb-mig_535.54.03.xml"
    smi = sim / "bin" / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0)" ;;
  "-q -x") cat {capture} ;;
  "--query-gpu=driver_version --format=csv,noheader") echo 535.54.03 ;;
  *) exit 1 ;;
esac
""")
    smi.chmod(0o755)
    env = simulated_libraries(cc, sim, tmp, {})
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SIMULATE, "sh",
                          str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    lines = {line.split()[1]: line for line in run.stdout.splitlines() if line.startswith("gpu-check: ")}
    assert run.returncode == 1, run.stdout + run.stderr
    assert lines["labels"].startswith("gpu-check: labels    FAIL ") and "nvml unavailable" in lines["labels"]
    assert lines["versions"] == ("gpu-check: versions  OK   kernel module 535.54.03, nvidia-smi 535.54.03, "
                                 "libnvidia-ml.so.1 535.54.03")
    assert lines["cuda"].startswith("gpu-check: cuda      OK   driver 535.54.03: CUDA 12.2 (nvidia-smi)")
    assert "gpu: 1 NVIDIA GPU(s): 0000:01:00.0" in lines["doctor"]
    assert "devices: missing /dev/nvidiactl" in lines["doctor"]
    cdi = lines["cdi"].removeprefix("gpu-check: cdi       FAIL ").split("; ")
    assert cdi and all(p.startswith("no device node /dev/nvidia") for p in cdi), lines["cdi"]
    # NVML cannot start from the stand-in libraries, so the health verdict says so (and fails)
    assert lines["health"].startswith("gpu-check: health    FAIL NVMLUnavailable: NVML unavailable: "), lines
    assert run.stdout.splitlines()[-1] == "gpu-check: 4 of 6 checks failed: labels, doctor, health, cdi"
    assert list(tmp.iterdir()) == []  # the temp directory is gone, nothing else was written there


SMI_C = r"""
#include <stdio.h>
#include <string.h>
/* nvidia-smi as on a machine whose driver works: a real ELF, so it also runs chrooted into a root */
int main(int argc, char **argv) {
    char all[256] = "";
    for (int i = 1; i < argc; i++) { strcat(all, i > 1 ? " " : ""); strncat(all, argv[i], 100); }
    if (argc == 1) { puts("NVIDIA-SMI 535.54.03 (stand-in)"); return 0; }
    if (!strcmp(all, "-L")) { puts("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0)"); return 0; }
    if (!strcmp(all, "--query-gpu=driver_version --format=csv,noheader")) { puts("535.54.03"); return 0; }
    if (!strcmp(all, "-q -x")) {
        FILE *f = fopen(CAPTURE, "r");
        int c;
        if (!f) return 1;
        while ((c = fgetc(f)) != EOF) putchar(c);
        return 0;
    }
    return 1;
}
"""
NVML_MORE_C = r"""
/* what nvidia-ctk cdi generate calls beyond GFD's set (appended to nvidia.nvml_serving's source) */
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    for (unsigned int i = 0; i < N; i++)
        if (!strcmp(GPUS[i].uuid, uuid)) { *d = &GPUS[i]; return 0; }
    return 6;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) { (void)d; *is = 0; return 0; }
"""
DEVICES = r"""
mkdir -p "$SIM/devup" "$SIM/devwork" "$SIM/olddev"
mount --rbind /dev "$SIM/olddev"
mount -t overlay overlay -o "lowerdir=/dev,upperdir=$SIM/devup,workdir=$SIM/devwork" /dev
for m in pts shm mqueue; do
  if [ -d "$SIM/olddev/$m" ]; then mount --rbind "$SIM/olddev/$m" "/dev/$m"; fi
done
mknod -m 666 /dev/nvidiactl c 195 255
mknod -m 666 /dev/nvidia0 c 195 0
mknod -m 666 /dev/nvidia1 c 195 1
mknod -m 666 /dev/nvidia-uvm c 509 0
mknod -m 666 /dev/nvidia-uvm-tools c 509 1
d=/sys/bus/pci/devices/0000:01:00.0
echo -1 > $d/numa_node
printf '0x0000000000000000 0x0000000000000000 0x0000000000000000\n' > $d/resource
head -c 256 /dev/zero > $d/config
echo 0x10de > $d/subsystem_vendor
echo 0x1463 > $d/subsystem_device
"""


def test_nvidia_binaries_against_a_simulated_driver(tmp_path: Path, nvidia_smi_fixtures: Path,
                                                    test_cache: Path) -> None:
    """--nvidia-bin: NVIDIA's real GFD, nvidia-ctk and validator against the simulated driver of the
    test above, made whole enough for them: `libnvidia-ml` answers NVML's calls with the A100 capture's
    facts (tests/support/nvidia.py `nvml_serving`, as tests/slow/labels/test_labels_gfd.py), `nvidia-smi`
    is a compiled stand-in (it must also run chrooted into the mirrored root, where the validator runs
    it), and /dev/nvidia* are mknod stand-ins on an overlay of /dev in the private mount namespace."""
    from tests.support import nvidia

    cc = shutil.which("cc") or shutil.which("gcc")
    reason = nvidia.skip_reason()
    if reason or not shutil.which("unshare") or cc is None:
        pytest.skip(reason or "needs unshare and a C compiler")
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver loaded: run scripts/gpu-check.sh itself")
    stack = nvidia.nvidia_binaries(test_cache)
    sim, tmp, bindir = tmp_path / "sim", tmp_path / "tmp", tmp_path / "nvidia-bin"
    for d in (sim / "bin", sim / "libs", tmp, bindir):
        d.mkdir(parents=True)
    for name in ("gpu-feature-discovery", "nvidia-ctk", "nvidia-validator"):
        (bindir / name).symlink_to(stack[name])
    # the A100 capture with MIG off: nvidia-ctk makes no whole-GPU device of a MIG-enabled GPU
    capture = sim / "a100.xml"
    capture.write_text((nvidia_smi_fixtures / "a100-sxm4-80gb-mig_535.54.03.xml").read_text()
                       .replace("_mig>Enabled<", "_mig>Disabled<"))
    (sim / "smi.c").write_text(SMI_C)
    subprocess.run([cc, "-O2", f'-DCAPTURE="{capture}"', "-o", sim / "bin/nvidia-smi", sim / "smi.c"],
                   check=True)
    (sim / "nvml.c").write_text(nvidia.nvml_serving(capture.read_bytes()) + NVML_MORE_C)
    env = simulated_libraries(cc, sim, tmp, {"libnvidia-ml": "nvml.c"})
    setup = SIMULATE.replace("exec \"$@\"", DEVICES + "exec \"$@\"")
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", setup, "sh",
                          str(SCRIPT), "--nvidia-bin", str(bindir)],
                         env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout.splitlines()
    lines = {line.split()[1]: line for line in out if line.startswith("gpu-check: ")}
    assert run.returncode in (0, 1) and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert lines["labels"].startswith("gpu-check: labels    OK   NVML and nvidia-smi agree")  # NVML stand-in
    assert lines["cdi"].startswith("gpu-check: cdi       OK   valid CDI 0.5.0 spec")
    assert lines["gfd"] == ("gpu-check: gfd       OK   GFD and nodeprep agree on 25 nvidia.com labels "
                            "(GFD only, as documented: nvidia.com/gfd.timestamp; nodeprep only: "
                            "nvidia.com/gpu.present)")
    assert lines["ctk"].startswith("gpu-check: ctk       OK   nvidia-ctk's CDI 0.5.0 spec: 3 devices, ")
    listed = dict(line.strip().split(": ", 1) for line in out[out.index(lines["ctk"]) + 1:]
                  if line.startswith("    "))
    hooks = listed["hooks only nvidia-ctk's spec has"].split(", ")
    assert "createContainer:nvidia-cdi-hook update-ldcache" in hooks and len(hooks) == 5
    assert listed["hooks only nodeprep's spec has"].startswith("createContainer:cdi-hook")
    # the stand-in NVML numbers GPU 0 minor 0; the capture's procfs entry (nodeprep's source) says 1
    assert listed["nodes only nodeprep's spec has"] == "/dev/nvidia1"
    assert lines["validator"].startswith(
        "gpu-check: validator OK   nvidia-validator -c driver found and ran the root's nvidia-smi through "
        "nodeprep's entry points (/usr/bin/nvidia-smi,")
    assert list(tmp.iterdir()) == []  # the temp directory is gone, nothing else was written there


def test_nvidia_bin_must_name_a_directory(tmp_path: Path) -> None:
    for args in (["--nvidia-bin"], ["--nvidia-bin", str(tmp_path / "absent")], ["--keep", "--nvidia-bin"]):
        bad = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2
        assert bad.stderr.startswith("usage: scripts/gpu-check.sh [--keep] [--nvidia-bin DIR]")


def test_nvidia_binaries_plain_zst_or_xz(tmp_path: Path) -> None:
    """--nvidia-bin takes NAME, NAME.zst (long window, as in the tests' NODEPREP_NVIDIA_BIN) or NAME.xz
    (as brought to the GPU machine): compressed ones come out byte for byte, executable, in the work
    directory."""
    import lzma

    import zstandard

    gpu_check = gpu_check_module()
    src, work = tmp_path / "bin", tmp_path / "work"
    src.mkdir()
    work.mkdir()
    body = {name: f"#!/bin/sh\necho {name}\n".encode() * 100 for name in ("plain", "zst", "xz")}
    (src / "plain").write_bytes(body["plain"])
    (src / "plain").chmod(0o755)
    (src / "zst.zst").write_bytes(zstandard.ZstdCompressor(level=19).compress(body["zst"]))
    (src / "xz.xz").write_bytes(lzma.compress(body["xz"]))
    for name, data in body.items():
        path = gpu_check.nvidia_binary(src, work, name)
        assert path is not None and path.read_bytes() == data and os.access(path, os.X_OK)
        assert path == (src / name if name == "plain" else work / "nvidia-bin" / name)
    assert gpu_check.nvidia_binary(src, work, "absent") is None


def test_gfd_and_ctk_fail_with_one_line_naming_what_is_missing_or_failed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The comparisons with NVIDIA's GFD and nvidia-ctk: the tool not in --nvidia-bin, nodeprep's side
    missing, the tool failing (its last stderr line shown) or writing no output: each one FAIL line."""
    gpu_check = gpu_check_module()
    failing, silent = tmp_path / "failing", tmp_path / "silent"
    failing.write_text("#!/bin/sh\necho first >&2\necho 'the tool broke' >&2\nexit 4\n")
    silent.write_text("#!/bin/sh\nexit 0\n")
    for tool in (failing, silent):
        tool.chmod(0o755)
    report = gpu_check.Report()
    for tool, ours in ((None, {}), (failing, None), (failing, {}), (silent, {})):
        gpu_check.check_gfd(report, tmp_path, tool, ours)
        gpu_check.check_ctk(report, tmp_path, tool, ours)
    assert capsys.readouterr().out.splitlines() == [
        "gpu-check: gfd       FAIL no gpu-feature-discovery in --nvidia-bin",
        "gpu-check: ctk       FAIL no nvidia-ctk in --nvidia-bin",
        "gpu-check: gfd       FAIL nodeprep labels failed (see labels)",
        "gpu-check: ctk       FAIL nodeprep's spec was not generated (see cdi)",
        "gpu-check: gfd       FAIL gpu-feature-discovery --oneshot exit 4: the tool broke",
        "gpu-check: ctk       FAIL nvidia-ctk cdi generate exit 4: the tool broke",
        "gpu-check: gfd       FAIL gpu-feature-discovery --oneshot exit 0: (no output)",
        "gpu-check: ctk       FAIL nvidia-ctk cdi generate exit 0: (no output)",
    ]
    assert report.failed == ["gfd", "ctk"] * 4 and report.count == 8
