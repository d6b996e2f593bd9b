"""The node profile's model: immutable sections (driver, labels, cluster, runtime, mig, health) and the value
domains their fields are checked against (nodeprep/profile/rules.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ..vocab import DEFAULT_FLAVOUR, DEFAULT_MODULES, FABRICMANAGER_MODES, GPUDIRECT_MODULES

K8S_VERSION_RE = re.compile(r"^v?(1)\.(\d{1,2})(?:\.(\d{1,3}))?$")
CA_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
FLAG_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
OLDEST_KUBERNETES = (1, 27)


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


GPU_TAINT = Taint("nvidia.com/gpu", "NoSchedule", "present")
UNVERIFIED_TAINT = Taint("nodeprep.dev/unverified", "NoSchedule")
# while the node's condition GPUHealthy is False (nodeprep health; lifted by nodeprep verify-nodes)
UNHEALTHY_TAINT = Taint("nodeprep.dev/gpu-unhealthy", "NoSchedule")


@dataclass(frozen=True)
class Daemons:
    """The driver's daemons a node runs: persistenced (True: its unit), Fabric Manager (auto: its unit
    with the hardware's ExecCondition, always: without it, never: no unit)."""

    persistenced: bool = True
    fabricmanager: str = FABRICMANAGER_MODES[0]


DEFAULT_DAEMONS = Daemons()


@dataclass(frozen=True)
class Driver:
    version: str | None = None  # None: driver.branch or driver.gpus chooses it from the store
    # None: whichever flavour the store has for the version and kernel (the command line's and the
    # role's default); a profile without driver.flavour has DEFAULT_FLAVOUR
    flavour: str | None = DEFAULT_FLAVOUR
    store: str | None = None
    kernel: str | None = None
    modules: tuple[str, ...] = DEFAULT_MODULES
    registry_auth: str | None = None
    ca_file: str | None = None
    insecure_http: bool = False
    # GPUDirect modules loaded after nvidia (vocab.GPUDIRECT_MODULES; node/gpudirect.py), default none
    gpudirect: tuple[str, ...] = ()
    persistenced: bool = True  # the unit of the active version's nvidia-persistenced
    fabricmanager: str = FABRICMANAGER_MODES[0]  # its Fabric Manager's unit: auto, always, never
    persistence_mode: str = "any"  # the GPU self-test's expectation: enabled, disabled or any
    fabric_timeout: int = 120  # seconds the GPU self-test waits for the NVLink fabric to complete
    keep_boot_kernel: bool = False  # kernel hook: keep booting a kernel that has the driver
    branch: str | None = None  # "580": a version of this branch (the policy's, running the GPUs)
    gpus: str | None = None  # "node" or "10de:2335,...": the version and flavour follow these GPUs
    branch_policy: str = "newest"

    @property
    def daemons(self) -> Daemons:
        """Which of the active driver's daemons the node runs (node/integration.py writes their units)."""
        return Daemons(self.persistenced, self.fabricmanager)

    @property
    def load_order(self) -> tuple[str, ...]:
        """What the node loads: `modules` with the chosen GPUDirect modules appended in
        GPUDIRECT_MODULES' order (each once, after nvidia; node/gpudirect.py, node/devices.py)."""
        chosen = [m for m in GPUDIRECT_MODULES if m in self.gpudirect and m not in self.modules]
        if not chosen:
            return self.modules
        head = self.modules if "nvidia" in self.modules else ("nvidia", *self.modules)
        return (*head, *chosen)


# What a front-end's flags and task options start from: the defaults, but no flavour (whichever the
# store has): commands/defaults.py, the collection's nodeprep_driver, the generated Ansible defaults
UNSET_DRIVER = Driver(flavour=None)


@dataclass(frozen=True)
class Labels:
    extra: dict[str, str] = field(default_factory=dict)
    cloud: str = "auto"
    mig_strategy: str = "none"  # GFD's --mig-strategy


@dataclass(frozen=True)
class Cluster:
    api_server: str
    mode: str = "kubeadm"
    token_file: str = "/etc/nodeprep/bootstrap-token"
    ca_cert_hashes: tuple[str, ...] = ()
    ca_cert_file: str = "/etc/kubernetes/pki/ca.crt"
    kubernetes_version: str = "1.31"
    node_name: str | None = None
    taints: tuple[Taint, ...] = ()
    gpu_taint: bool = False
    verify_gpus: bool = True
    cri_socket: str = "unix:///run/containerd/containerd.sock"
    cgroup_driver: str = "systemd"
    kubelet_extra_args: dict[str, str] = field(default_factory=dict)
    feature_gates: dict[str, bool] = field(default_factory=dict)

    @property
    def minor(self) -> tuple[int, int]:
        """(major, minor) of kubernetes_version, e.g. (1, 31)."""
        m = K8S_VERSION_RE.fullmatch(self.kubernetes_version)
        assert m, self.kubernetes_version
        return int(m.group(1)), int(m.group(2))

    @property
    def all_taints(self) -> tuple[Taint, ...]:
        """Taints to register with: `taints`, plus nvidia.com/gpu=present:NoSchedule when gpu_taint, plus
        nodeprep.dev/unverified:NoSchedule when verify_gpus (lifted by `nodeprep verify-nodes` once the
        node's GPU self-test passed)."""
        taints = self.taints
        if self.gpu_taint and not any(
            t.key == GPU_TAINT.key and t.effect == GPU_TAINT.effect for t in self.taints
        ):
            taints = (*taints, GPU_TAINT)
        if self.verify_gpus and not any(t.key == UNVERIFIED_TAINT.key for t in taints):
            taints = (*taints, UNVERIFIED_TAINT)
        return taints


@dataclass(frozen=True)
class Runtime:
    containerd_config: str = "/etc/containerd/config.toml"
    nvidia_runtime: bool = True
    nvidia_runtime_path: str = "/usr/bin/nvidia-container-runtime"
    cdi: bool = True
    cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
    default_runtime: bool = False
    cdi_hook_path: str | None = None  # NVIDIA's nvidia-cdi-hook; None: found on the node's PATH


@dataclass(frozen=True)
class Mig:
    config: dict[str, Any] | None = None  # mig-parted's document, as profile.migparted checked it
    select: str | None = None  # the mig-config to apply; None: the only one


@dataclass(frozen=True)
class Health:
    enabled: bool = True  # the join installs nodeprep-health.service
    hold: int = 60  # seconds healthy before a GPU counts as healthy again (nodeprep health --hold)


@dataclass(frozen=True)
class Profile:
    driver: Driver
    labels: Labels = field(default_factory=Labels)
    cluster: Cluster | None = None
    runtime: Runtime = field(default_factory=Runtime)
    mig: Mig = field(default_factory=Mig)
    health: Health = field(default_factory=Health)
    source: str = field(default="profile", compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Every field, defaults filled in, as plain JSON-able data (parse_profile reads it back)."""
        out: dict[str, Any] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            if section is None:
                continue
            out[name] = {f.name: to_plain(getattr(section, f.name)) for f in fields(section)}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def to_plain(value: Any) -> Any:
    if isinstance(value, Taint):
        return value.to_dict()
    if isinstance(value, tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


SECTIONS: dict[str, type] = {"driver": Driver, "labels": Labels, "cluster": Cluster, "runtime": Runtime,
                             "mig": Mig, "health": Health}
