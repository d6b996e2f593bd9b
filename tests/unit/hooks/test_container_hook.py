"""nodeprep's createContainer hook as the runtime runs it: a real process started the way the CDI
spec says (`python -S -m nodeprep.hooks.container --driver V`), the OCI state JSON on stdin and the
container's config.json in the bundle (written here in the OCI runtime-spec layout). The container
start itself is in tests/slow/join/test_cdi_runtimes.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nodeprep.hooks.container import requirement_problem
from nodeprep.join import cdi

REQUIRE_12_2 = "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471"
REQUIRE_12_4 = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"


def run_hook(
    tmp_path: Path, env: list[str], driver: str = "535.309.01"
) -> subprocess.CompletedProcess[str]:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(
        json.dumps(
            {"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": env}, "root": {"path": "rootfs"}}
        )
    )
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle)}
    path, argv, hook_env = cdi.hook_command()
    return subprocess.run(
        [*argv, "--driver", driver],
        executable=path,
        input=json.dumps(state),
        capture_output=True,
        text=True,
        env=dict(e.split("=", 1) for e in hook_env),
        timeout=60,
    )


def test_allowed_refused_bypassed(tmp_path: Path) -> None:
    ok = run_hook(tmp_path, ["PATH=/usr/bin", f"NVIDIA_REQUIRE_CUDA={REQUIRE_12_2}"])
    assert ok.returncode == 0 and ok.stderr == ""
    refused = run_hook(tmp_path, [f"NVIDIA_REQUIRE_CUDA={REQUIRE_12_4}"])
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "nodeprep: container refused: NVIDIA_REQUIRE_CUDA requires CUDA >=12.4, but driver 535.309.01 "
        "supports up to CUDA 12.2 (set NVIDIA_DISABLE_REQUIRE=1 to skip the check)"
    ]
    bypassed = run_hook(tmp_path, [f"NVIDIA_REQUIRE_CUDA={REQUIRE_12_4}", "NVIDIA_DISABLE_REQUIRE=true"])
    assert bypassed.returncode == 0
    assert run_hook(tmp_path, ["PATH=/usr/bin"]).returncode == 0  # no requirement: nothing to check


def test_malformed_requirement_and_bad_state(tmp_path: Path) -> None:
    bad = run_hook(tmp_path, ["NVIDIA_REQUIRE_CUDA=cuda>>12.2"])
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert "NVIDIA_REQUIRE_CUDA: malformed constraint 'cuda>>12.2'" in bad.stderr
    path, argv, env = cdi.hook_command()
    r = subprocess.run([*argv, "--driver", "535.309.01"], executable=path, input="not json",
                       capture_output=True, text=True, env=dict(e.split("=", 1) for e in env), timeout=60)
    assert r.returncode == 1 and "cannot read the container's OCI state/config" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.2", "NVIDIA_REQUIRE_DRIVER": "driver>=550"}, True),  # ANDed
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.2", "NVIDIA_DISABLE_REQUIRE": "1"}, False),
        ({"NVIDIA_REQUIRE_CUDA": ""}, False),
    ],
)
def test_every_require_variable_counts(env: dict[str, str], refused: bool) -> None:
    assert (requirement_problem(env, "535.216.03") is not None) is refused
