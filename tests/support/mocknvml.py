"""NVIDIA's NVML mock (`libnvidia-ml.so` from NVIDIA/k8s-test-infra `pkg/gpu/mocknvml`, Apache-2.0,
built from its source; 8-GPU A100/H100/B200/GB200/GB300/L40S/T4 machines from YAML, with NVLink, ECC,
fabric state and injected faults) as the NVML a test talks to when no GPU is here.

Found through one variable, `NODEPREP_MOCKNVML`: a directory with `lib/libnvidia-ml.so.1` and
`configs/*.yaml` (`.ci/run` points it at ../shared/mocknvml when that is beside the clone; without it
the tests that need it skip, saying why). The library is checked against the sha256 its README
gives before any test loads it. A test that uses it says so in its docstring.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import binaries

ENV = "NODEPREP_MOCKNVML"
LIBRARY = "lib/libnvidia-ml.so.550.163.01"
LIBRARY_SHA256 = "e90b45f56eaab0ffb0f940439db6740b67d381fb9da39af9c0130354cb7d45ec"
MACHINES = ("a100", "h100", "b200", "gb200", "gb300", "l40s", "t4")


def skip_reason() -> str | None:
    """Why the mock cannot be used here (None when it can)."""
    found = binaries.pinned(ENV, "NVIDIA's NVML mock (.ci/run points it at ../shared/mocknvml)", LIBRARY,
                            LIBRARY_SHA256, " is not the mock its README describes (sha256 differs)")
    return found if isinstance(found, str) else None


def root() -> Path:
    """The mock's directory (call skip_reason() first)."""
    return Path(os.environ[ENV])


def lib_dir(cache: Path) -> Path:
    """A folder holding `libnvidia-ml.so.1` and `libnvidia-ml.so` (for LD_LIBRARY_PATH), as links to the
    mock's library in `<cache>/mocknvml/`: the copy in ../shared holds its soname links as small text
    files naming their target, which the dynamic loader cannot load."""
    folder = cache / "mocknvml" / LIBRARY_SHA256[:16]
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(root() / LIBRARY)
    return folder


def config(machine: str) -> Path:
    """The YAML profile of one machine (`h100`, `b200`, ...) or a named file (`example-h100-faults`)."""
    name = f"mock-nvml-config-{machine}.yaml" if machine in MACHINES else f"{machine}.yaml"
    return root() / "configs" / name


DERIVED = Path(__file__).resolve().parents[1] / "fixtures" / "mocknvml"  # patches, README there


def _merge(base: object, patch: object) -> object:
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in patch.items()}}
    return patch


def derived(name: str, folder: Path) -> Path:
    """The profile `tests/fixtures/mocknvml/<name>.yaml` describes (its `base` machine's profile with
    the rest deep-merged over it; a `devices:` entry merges into the device with its `index`), written
    to `folder/<name>.yaml`."""
    import yaml

    patch = yaml.safe_load((DERIVED / f"{name}.yaml").read_text())
    profile = yaml.safe_load(config(patch.pop("base")).read_text())
    for entry in patch.pop("devices", []):
        device = next(d for d in profile["devices"] if d["index"] == entry["index"])
        device.update(_merge(device, entry))  # type: ignore[arg-type]
    profile = _merge(profile, patch)
    out = folder / f"{name}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(profile, sort_keys=False))
    return out


def env(cache: Path, machine: str | Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which NVML is the mock answering as `machine` (a name or a YAML path)."""
    out = dict(base if base is not None else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
    out["LD_LIBRARY_PATH"] = str(lib_dir(cache))
    out["MOCK_NVML_CONFIG"] = str(machine if isinstance(machine, Path) else config(machine))
    return out
