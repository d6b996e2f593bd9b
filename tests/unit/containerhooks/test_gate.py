"""The CUDA gate (nodeprep.containerhooks.gate) as a runtime runs it: a real process started with the command
of the hooks.d file nodeprep writes, the OCI state JSON on stdin and the container's config.json in
its bundle (OCI runtime-spec layout). The node's driver is a versioned root's `current` link and the
GPU facts are recorded facts files written here (brands as NVML names them), not a live GPU. Real
container starts through podman: tests/slow/join/test_cuda_gate_podman.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from nodeprep.cli import main
from nodeprep.containerhooks import gate
from nodeprep.runtime import ocihooks
from nodeprep.runtime.files import apply_changes
from nodeprep.runtime.hookprogram import hook_program
from tests.support.clirunner import separate_stderr
from tests.unit.join.conftest import node_python

DRIVER = "535.309.01"  # supports up to CUDA 12.2
GPU_DEVICE = {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}
CTL_DEVICE = {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}
TESLA = {"gpus": [{"brand": "tesla", "arch": "7.5", "name": "Tesla T4"}]}
GEFORCE = {"gpus": [{"brand": "geforce", "arch": "8.6", "name": "NVIDIA GeForce RTX 3090"}]}


def node(tmp_path: Path, facts: dict | None = TESLA) -> tuple[Path, Path]:  # type: ignore[type-arg]
    """(driver root link, facts file) of a node running DRIVER."""
    opt = tmp_path / "opt/nvidia"
    (opt / DRIVER).mkdir(parents=True, exist_ok=True)
    current = opt / "current"
    if not current.is_symlink():
        current.symlink_to(DRIVER)
    path = opt / "gpu-facts.json"
    if facts is not None:
        path.write_text(json.dumps(facts))
    return current, path


def run_gate(
    tmp_path: Path, env: list[str], *, devices: list[dict] | None = None,  # type: ignore[type-arg]
    facts: dict | None = TESLA, config: dict | None = None, compat: str | None = None,  # type: ignore[type-arg]
    command: tuple[str, list[str]] | None = None,
) -> subprocess.CompletedProcess[str]:
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True, exist_ok=True)
    if compat:
        (rootfs / "usr/local/cuda/compat").mkdir(parents=True, exist_ok=True)
        (rootfs / f"usr/local/cuda/compat/libcuda.so.{compat}").write_bytes(b"\x7fELF")
    linux = {"devices": devices if devices is not None else [GPU_DEVICE, CTL_DEVICE]}
    doc = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": env}, "root": {"path": "rootfs"},
           "linux": linux, **(config or {})}
    (bundle / "config.json").write_text(json.dumps(doc))
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle)}
    current, facts_file = node(tmp_path, facts)
    if command is None:  # the hook program as `nodeprep runtime` writes it, here under tmp_path/node
        changes = hook_program(tmp_path / "node")
        apply_changes(changes)
        program = changes[-1]  # the modules file, then the program that loads it
        hook = ocihooks.gate_hook()
        command = (str(program.path),
                   [*hook["args"], "--driver-root", str(current), "--facts", str(facts_file)])
    return subprocess.run(command[1], executable=command[0], input=json.dumps(state), capture_output=True,
                          text=True, env={}, timeout=60)


def refusal(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_allowed_refused_bypassed(tmp_path: Path) -> None:
    assert run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=12.2"]).returncode == 0
    line = refusal(run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=99.0"]))
    assert line == ("nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=99.0, but driver "
                    f"{DRIVER} supports up to CUDA 12.2 (set NVIDIA_DISABLE_REQUIRE=1 to skip the check)")
    bypassed = run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=1"])
    assert bypassed.returncode == 0 and bypassed.stderr == ""


@pytest.mark.parametrize(
    "config",
    [
        {"linux": {"devices": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]}},
        {"linux": {}},
        # a CUDA image run without a GPU: NVIDIA_VISIBLE_DEVICES from the image, no NVIDIA runtime hook
        {"linux": {}, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"]}},
    ],
)
def test_container_without_a_gpu_is_untouched(tmp_path: Path, config: dict) -> None:  # type: ignore[type-arg]
    r = run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=99.0"], config=config, compat="575.51.03")
    assert r.returncode == 0 and r.stderr == ""
    assert not (tmp_path / "bundle/rootfs/etc").exists()  # no compat ld.so.conf.d entry either


@pytest.mark.parametrize(
    "config",
    [
        {"linux": {"devices": [{"path": "/dev/gpu0", "type": "c", "major": 195, "minor": 0}]}},  # by major
        {"linux": {}, "mounts": [{"destination": "/dev/nvidia0", "source": "/dev/nvidia0", "type": "bind"}]},
        {"linux": {}, "hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook"}]},
         "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"]}},
    ],
)
def test_every_way_a_gpu_reaches_the_container_is_gated(tmp_path: Path, config: dict) -> None:  # type: ignore[type-arg]
    r = run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=99.0"], config=config)
    assert "requires CUDA >=99.0" in refusal(r)


@pytest.mark.parametrize(
    ("env", "facts", "allowed"),
    [
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.2", "NVIDIA_REQUIRE_DRIVER=driver>=550"], TESLA, False),  # ANDed
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=535,driver<536"], TESLA, True),  # OR
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=535,driver<536"], GEFORCE, False),
        (["NVIDIA_REQUIRE_ARCH=arch>=8.0"], TESLA, False),  # a T4 is 7.5
        (["NVIDIA_REQUIRE_ARCH=arch>=8.0"], GEFORCE, True),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.2,gpu>=1"], TESLA, True),  # unknown property: skipped
        (["NVIDIA_REQUIRE_CUDA=brand=tesla"], None, False),  # no facts: brand unknown
    ],
)
def test_nvidia_requirement_semantics(
    tmp_path: Path, env: list[str], facts: dict | None, allowed: bool  # type: ignore[type-arg]
) -> None:
    r = run_gate(tmp_path, env, facts=facts)
    assert (r.returncode == 0) is allowed, r.stderr


def test_malformed_requirement_is_refused_in_one_line(tmp_path: Path) -> None:
    line = refusal(run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>>12"]))
    assert "NVIDIA_REQUIRE_CUDA: malformed constraint 'cuda>>12'" in line


def test_compat_allowed_on_a_data_center_gpu(tmp_path: Path) -> None:
    r = run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=12.9"], compat="575.51.03")
    assert r.returncode == 0, r.stderr
    conf = tmp_path / "bundle/rootfs/etc/ld.so.conf.d/00-compat-nodeprep.conf"
    assert conf.read_text() == "/usr/local/cuda/compat\n"  # first in the image's ld cache
    # newer than what the compat library supports: refused, saying both
    line = refusal(run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=13.0"], compat="575.51.03"))
    assert "forward-compatibility libcuda 575.51.03 up to CUDA 12.9" in line


def test_compat_refused_on_geforce(tmp_path: Path) -> None:
    line = refusal(run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=12.9"], facts=GEFORCE, compat="575.51.03"))
    assert line == (
        "nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=12.9, but driver "
        f"{DRIVER} supports up to CUDA 12.2; the image's forward-compatibility libcuda 575.51.03 is not "
        "used: GPU brand geforce does not support CUDA forward compatibility "
        "(set NVIDIA_DISABLE_REQUIRE=1 to skip the check)"
    )
    # allowed without compat (no requirement), and the compat library is still not put first (error 804)
    assert run_gate(tmp_path, [], facts=GEFORCE, compat="575.51.03").returncode == 0
    assert not (tmp_path / "bundle/rootfs/etc/ld.so.conf.d/00-compat-nodeprep.conf").exists()
    # no facts recorded: the brand is unknown, compat is not trusted either
    assert refusal(run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=12.9"], facts=None, compat="575.51.03"))


def test_compat_library_older_than_the_driver_is_ignored(tmp_path: Path) -> None:
    assert run_gate(tmp_path, [], compat="525.60.13").returncode == 0
    assert not (tmp_path / "bundle/rootfs/etc").exists()


@pytest.mark.parametrize(
    "config",
    [{"linux": ["nvidia"]}, {"linux": {"devices": "nvidia"}}, {"linux": {}, "mounts": {"nvidia": 1}}],
)
def test_odd_config_shapes_are_no_gpu_not_a_traceback(tmp_path: Path, config: dict) -> None:  # type: ignore[type-arg]
    r = run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=99.0"], config=config)
    assert r.returncode == 0 and r.stderr == ""


def test_bad_state_and_bad_facts(tmp_path: Path) -> None:
    changes = hook_program(tmp_path / "node")
    apply_changes(changes)
    program = changes[-1]  # the modules file, then the program that loads it
    hook = ocihooks.gate_hook()
    r = subprocess.run(hook["args"], executable=program.path, input="not json", capture_output=True,
                       text=True, env={}, timeout=60)
    assert r.returncode == 1 and "cannot read the container's OCI state/config" in r.stderr
    assert "Traceback" not in r.stderr
    _, facts = node(tmp_path)
    facts.write_text("{not json")  # malformed facts: no brand known, no traceback
    assert "brand geforce" not in refusal(run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=brand=tesla"], facts=None))


def imported(tmp_path: Path, devices: list[dict]) -> set[str]:  # type: ignore[type-arg]
    """The modules the program imports for one container, as the node's python3 -IS runs it."""
    changes = hook_program(tmp_path / "node")
    apply_changes(changes)
    program = changes[-1]  # the modules file, then the program that loads it
    current, facts = node(tmp_path)
    args = [*ocihooks.gate_hook()["args"][1:], "--driver-root", str(current), "--facts", str(facts)]
    run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=12.2"], devices=devices)  # writes the bundle
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
             "bundle": str(tmp_path / "bundle")}
    r = subprocess.run(["/usr/bin/python3", "-IS", "-X", "importtime", str(program.path), *args],
                       input=json.dumps(state), capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("import time:")]
    return {line.rpartition("|")[2].strip() for line in lines}


def test_a_container_without_a_gpu_is_decided_before_os_is_imported(tmp_path: Path) -> None:
    plain = imported(tmp_path, [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}])
    assert "nodeprep.containerhooks.gate" in plain
    assert not plain & {"os", "nodeprep.containerhooks.container", "nodeprep.cuda"}, sorted(plain)
    gpu = imported(tmp_path / "gpu", [GPU_DEVICE, CTL_DEVICE])
    assert {"nodeprep.containerhooks.container", "nodeprep.cuda"} <= gpu
    assert "os" not in gpu, sorted(gpu)  # posix, its C half, does what the hooks need (~1.5 ms less)


def test_runtime_writes_the_hooks_d_file_that_runs_the_gate(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    node_python(root)
    profile = tmp_path / "node.yaml"
    profile.write_text('driver:\n  version: "535.309.01"\nruntime:\n  cdi: false\n')
    r = separate_stderr().invoke(main, ["runtime", "--profile", str(profile), "--root", str(root)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    written = root / ocihooks.HOOKS_DIR.lstrip("/") / ocihooks.HOOK_NAME
    doc = json.loads(written.read_text())
    assert doc["version"] == "1.0.0" and doc["when"] == {"always": True}
    assert doc["stages"] == ["createContainer"]
    assert doc["hook"]["args"][-4:] == ["--driver-root", gate.DRIVER_ROOT, "--facts", gate.FACTS]
    program = root / doc["hook"]["path"].lstrip("/")  # the node's hook program, written beside it
    assert os.access(program, os.X_OK)
    # the written command itself: no GPU, no facts, no driver root -> allowed at once
    no_gpu = run_gate(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>=99.0"], devices=[],
                      command=(str(program), doc["hook"]["args"]))
    assert no_gpu.returncode == 0 and no_gpu.stderr == ""


def test_a_brand_constraint_is_met_by_the_facts_and_named_when_not() -> None:
    """Seen on an H200 (NVML brand NVIDIA, 580.159.04: CUDA 13.0): `cuda>=13.0,brand=nvidia` holds with
    its facts; without them the refusal names the whole requirement and the facts, not the CUDA version."""
    h200 = [{"brand": "nvidia", "arch": "9.0"}]
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0,brand=nvidia"}
    assert gate.decide(env, "580.159.04", h200, None) == (None, False)
    problem, _ = gate.decide(env, "580.159.04", [{"brand": "geforce", "arch": "8.9"}], None)
    assert problem is not None
    assert problem.startswith("NVIDIA_REQUIRE_CUDA=cuda>=13.0,brand=nvidia is not met: driver 580.159.04 "
                              "supports up to CUDA 13.0; GPUs: brand geforce, arch 8.9")
    problem, _ = gate.decide(env, "580.159.04", [], None)
    assert problem is not None and f"GPUs: no GPU facts in {gate.FACTS}" in problem
    problem, _ = gate.decide({"NVIDIA_REQUIRE_CUDA": "cuda>=13.1,brand=nvidia"}, "580.159.04", h200, None)
    assert problem is not None and problem.startswith(
        "NVIDIA_REQUIRE_CUDA requires CUDA >=13.1, but driver 580.159.04 supports up to CUDA 13.0")


def test_the_gate_leaves_a_container_with_the_spec_hook_to_it() -> None:
    spec_hook = {"path": "/usr/libexec/nodeprep/cdi-hook", "args": ["cdi-hook", "--driver", "580.159.04"]}
    gate_hook = {"path": "/usr/libexec/nodeprep/cdi-hook", "args": ["cdi-hook", "gate", "--driver-root", "x"]}
    assert gate.carries_spec_hook({"hooks": {"createContainer": [gate_hook, spec_hook]}})
    assert not gate.carries_spec_hook({"hooks": {"createContainer": [gate_hook]}})
    assert not gate.carries_spec_hook({"hooks": {"prestart": [spec_hook]}, "process": {"args": ["--driver"]}})
    assert not gate.carries_spec_hook({"hooks": "x"})
