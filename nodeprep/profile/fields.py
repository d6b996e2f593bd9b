"""The profile's field table: one row per field (section, key, rule, help, required, command-line
flag). The parser (nodeprep/profile/load.py), the JSON Schema (schema.py), the overrides and the
docs tests all read it; a field's constraint is said once, by its rule (rules.py, checks.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..vocab import (
    BRANCH_POLICIES,
    DRIVER_BRANCH_RE,
    DRIVER_VERSION_RE,
    FABRICMANAGER_MODES,
    FLAVOURS,
    GPUDIRECT_MODULES,
    GPUS_RE,
    KERNEL_RELEASE_RE,
)
from .checks import (
    abs_path,
    api_server,
    cri_socket,
    feature_gate,
    flag_name,
    k8s_version,
    kubelet_arg,
    label_pair,
    label_value,
    modules,
    node_name,
    scalar_str,
    store,
    taints,
)
from .migparted import NAME_RE as MIG_CONFIG_NAME_RE
from .migparted import mig_parted
from .model import CA_HASH_RE, K8S_VERSION_RE
from .rules import Rule, boolean, enum, integer, list_of, mapping, string


@dataclass(frozen=True)
class Field:
    section: str
    key: str
    rule: Rule
    help: str
    required: bool = False
    flag: str | None = None  # command-line option that overrides this field, e.g. "--driver-version"
    metavar: str = "VALUE"  # how the flag's value is shown in --help
    envvar: str | None = None  # an environment variable that gives the flag's value
    commands: tuple[str, ...] = ()  # the commands that offer `flag` (docs/profile.md, test_names.py)
    doc: str | None = None  # docs/profile.md's meaning when it says more than `help` (Markdown)
    file: bool = False  # names a file on the node (read beneath --root: node/driververbs.py)
    # driver fields: an option of nodeprep.fleet.nodeprep_driver and a variable nvidia_driver_KEY of the
    # role nvidia_driver (False: the node's self-test reads it, not the install)
    ansible: bool = True
    example: str | None = None  # its value in examples/node.yaml, as YAML (None: the default)

    @property
    def path(self) -> str:
        return f"{self.section}.{self.key}"

    def parse(self, value: Any) -> tuple[Any, list[str]]:
        return self.rule(value)

    @property
    def schema(self) -> dict[str, Any]:
        return dict(self.rule.schema)


FIELDS: tuple[Field, ...] = (
    # driver
    Field(
        "driver",
        "version",
        string(DRIVER_VERSION_RE, "is not a full driver version (expected e.g. 550.90.07)", nullable=True),
        "NVIDIA driver version to install, e.g. 535.309.01 (required unless driver.branch or "
        "driver.gpus chooses it; with driver.branch, a version of that branch)",
        flag="--driver", metavar="VERSION",
        doc="NVIDIA driver version to install, e.g. 535.309.01; with `driver.branch`, a version of that "
        "branch (else refused: `driver.branch: 580 contradicts driver.version 550.163.01 (of branch "
        "550): …`) (also `activate VERSION`)",
        commands=("install",), example="\"535.309.01\"",
    ),
    Field(
        "driver",
        "branch",
        string(DRIVER_BRANCH_RE, "is not a driver branch (its major number, e.g. 580)", nullable=True),
        "Driver branch to install the newest (driver.branch_policy) version of that the store has "
        "(and that runs driver.gpus), e.g. 580",
        flag="--branch", metavar="BRANCH",
        doc="Driver branch, its major number quoted (`\"580\"`): without `driver.version`, install takes "
        "the `driver.branch_policy`'s version of it in the store (with kernel modules for the kernel; "
        "of those that run `driver.gpus` when set); none in the store is refused naming the branch and "
        "the store ([docs/node.md](node.md#gpu-support-check-before-load))",
        commands=("install",),
    ),
    Field(
        "driver",
        "gpus",
        string(GPUS_RE, "is not 'node' or a comma list of NVIDIA PCI ids (10de:DEVICE[:SUBVENDOR:SUBDEVICE])",
               nullable=True),
        "GPUs the driver version and flavour follow, by each version's supported-GPU list in the store: "
        "node (the node's NVIDIA PCI devices) or 10de:DEVICE,...",
        flag="--gpus", metavar="node|10de:DEVICE,...",
        doc="GPUs the version (unless pinned) and flavour follow, by each version's `supported-gpus.json` "
        "in the store: `node` (the node's NVIDIA PCI devices under the root) or "
        "`\"10de:2335,10de:2901\"` (`10de:DEVICE[:SUBVENDOR:SUBDEVICE]`); a pinned version is checked "
        "against them instead (also `profile check --gpus`)",
        commands=("install", "build-matrix",),
    ),
    Field(
        "driver",
        "branch_policy",
        enum(*BRANCH_POLICIES),
        "Which version driver.gpus or driver.branch takes: the newest or the oldest that fits",
        flag="--branch-policy",
        doc="Which version `driver.gpus` or `driver.branch` takes: the newest or the oldest that fits",
        commands=("install", "build-matrix",),
    ),
    Field(
        "driver",
        "flavour",
        enum(*FLAVOURS),
        "Kernel module flavour: proprietary or open (open GPU kernel modules, Turing and newer)",
        flag="--flavour",
        commands=("install",),
    ),
    Field(
        "driver",
        "store",
        string(check=store, nullable=True),
        "Artifact store: a directory, file:// or http(s):// base URL with index.json, or an OCI registry "
        "repository oci://HOST[:PORT]/REPO[@sha256:DIGEST]",
        flag="--store", metavar="DIR|URL",
        doc="Artifact store: a directory, file:// or http(s):// base URL with index.json, or an OCI "
        "registry repository `oci://HOST[:PORT]/REPO[@sha256:DIGEST]` "
        "([docs/node.md](node.md#oci-registry-stores))",
        commands=("install",), example="https://artifacts.example.com/nvidia",
    ),
    Field(
        "driver",
        "registry_auth",
        string(check=abs_path, nullable=True),
        "Docker-style config.json with the registry's credentials (mode 0600; never the credentials "
        "themselves in the profile)",
        flag="--registry-auth", metavar="FILE", envvar="NODEPREP_REGISTRY_AUTH",
        commands=("install", "cloud-init",), file=True,
    ),
    Field(
        "driver",
        "ca_file",
        string(check=abs_path, nullable=True),
        "CA bundle (PEM) for the store's TLS certificate (default: the system's CAs)",
        flag="--ca-file", metavar="FILE",
        commands=("install", "cloud-init",), file=True,
    ),
    Field(
        "driver",
        "insecure_http",
        boolean,
        "Allow plain http (http://, oci+http://) to a store that is not on loopback",
        flag="--insecure-http",
        doc="Allow plain http (`http://`, `oci+http://`) to a store that is not on loopback",
        commands=("install",),
    ),
    Field(
        "driver",
        "kernel",
        string(KERNEL_RELEASE_RE, "is not a kernel release (e.g. 6.1.0-28-amd64)", nullable=True),
        "Kernel release to install modules for (default: the running kernel)",
        flag="--kernel", metavar="RELEASE",
        commands=("install", "activate",),
    ),
    Field(
        "driver",
        "modules",
        modules,
        "Kernel modules to load, in order",
        flag="--modules", metavar="LIST",
        doc="Kernel modules to load, in order; must include nvidia; nvidia-drm (display) and "
        "nvidia-peermem (GPUDirect RDMA) allowed",
        commands=("install", "activate", "rollback",),
    ),
    Field(
        "driver",
        "gpudirect",
        list_of(enum(*GPUDIRECT_MODULES)),
        "GPUDirect modules loaded after nvidia (default none): nvidia-fs (GPUDirect Storage) and gdrdrv "
        "(gdrcopy, makes /dev/gdrdrv) need an artifact built with them; nvidia-peermem loads only where "
        "the InfiniBand stack exports the peer-memory API, else DMA-BUF is the path",
        doc="GPUDirect modules loaded after nvidia, any of `nvidia-peermem`, `nvidia-fs`, `gdrdrv` "
        "(default none). nvidia-fs and gdrdrv need a kmod artifact built with them (`build-driver "
        "--nvidia-fs/--gdrcopy`, docs/build.md); `/dev/gdrdrv` is made from gdrdrv's major in "
        "/proc/devices; nvidia-peermem loads only where `ib_register_peer_memory_client` is exported "
        "(/proc/kallsyms or MLNX_OFED's ib_core Module.symvers), else one line says DMA-BUF is the "
        "path",
    ),
    Field(
        "driver",
        "persistenced",
        boolean,
        "Run the active driver's nvidia-persistenced (unit nodeprep-persistenced.service, default true); "
        "false: no unit, one nodeprep wrote is removed",
        flag="--no-persistenced",
        commands=("install",),
    ),
    Field(
        "driver",
        "fabricmanager",
        enum(*FABRICMANAGER_MODES),
        "Run the active driver's Fabric Manager (unit nodeprep-fabricmanager.service): auto (default) "
        "where the machine needs it (NVSwitch or its management bridge on PCI, never GB200/GB300: "
        "`nodeprep fabric-manager --condition`), always, or never (no unit, one nodeprep wrote is removed)",
        flag="--fabricmanager-mode", metavar="MODE",
        commands=("install",),
    ),
    Field(
        "driver",
        "persistence_mode",
        enum("any", "enabled", "disabled"),
        "GPU persistence mode the self-test (nodeprep verify-gpus) expects on every GPU",
        doc="Persistence mode the GPU self-test expects on every GPU: `enabled`, `disabled` or `any`",
        ansible=False,
    ),
    Field(
        "driver",
        "fabric_timeout",
        integer(0, 3600),
        "Seconds the GPU self-test (nodeprep verify-gpus) waits for NVML's fabric state COMPLETED on "
        "NVLink-fabric GPUs (Fabric Manager registers them) before a fabric still in progress fails it",
        doc="Seconds the GPU self-test waits for NVML's fabric state COMPLETED on NVLink-fabric GPUs "
        "(Fabric Manager registers them) before a fabric still in progress fails it "
        "([docs/node.md](node.md#fabric-manager-nodeprep-fabricmanagerservice))",
        ansible=False,
    ),
    Field(
        "driver",
        "keep_boot_kernel",
        boolean,
        "When a kernel installed later has no modules in the store, the kernel hook keeps the boot "
        "default (GRUB) on a kernel that has them",
        flag="--keep-boot-kernel",
        doc="When a kernel package installed later has no modules in the store, the kernel hook keeps the "
        "boot default (GRUB) on a kernel that has them ([docs/node.md](node.md#kernel-updates))",
        commands=("install",),
    ),
    # labels
    Field(
        "labels",
        "extra",
        mapping(label_value, pair_check=label_pair),
        "Extra node labels (key: value), validated against Kubernetes label syntax",
    ),
    Field(
        "labels",
        "cloud",
        enum("auto", "aws", "gce", "azure", "none"),
        "Cloud to read instance facts from: auto (DMI first), aws, gce, azure or none",
        flag="--cloud",
        commands=("labels",),
    ),
    Field(
        "labels",
        "mig_strategy",
        enum("none", "single", "mixed"),
        "GFD's MIG strategy for the GPU labels: none, single (gpu.product <model>-MIG-<profile>) or mixed "
        "(nvidia.com/mig-<profile>.*)",
        flag="--mig-strategy",
        doc="GFD's MIG strategy for the GPU labels: `none`, `single` (`gpu.product` "
        "`<model>-MIG-<profile>`) or `mixed` (`nvidia.com/mig-<profile>.*`); "
        "[docs/labels.md](labels.md)",
        commands=("labels",),
    ),
    # mig
    Field(
        "mig",
        "config",
        mig_parted,
        "MIG layouts in mig-parted's format (version: v1, mig-configs: name -> entries of devices, "
        "device-filter, mig-enabled, mig-devices), applied through NVML before labels and join",
        doc="MIG layouts in mig-parted's format: `version: v1` and `mig-configs` (name → entries of "
        "`devices` (`all` or GPU indexes), optional `device-filter` (PCI ids `0x233010DE`), "
        "`mig-enabled`, `mig-devices` (profile → count)), put in place by `nodeprep mig` and "
        "`bootstrap` before labels and join ([docs/node.md](node.md#mig-layout))",
    ),
    Field(
        "mig",
        "select",
        string(MIG_CONFIG_NAME_RE, "is not a config name (a label value)", nullable=True),
        "Which of mig.config's mig-configs this node gets (mig-manager's nvidia.com/mig.config); "
        "default: the only one",
        doc="Which of `mig.config`'s `mig-configs` this node gets (mig-manager's `nvidia.com/mig.config`); "
        "may be left out when there is one",
    ),
    # health
    Field(
        "health",
        "enabled",
        boolean,
        "Install the GPU health service (nodeprep-health.service, `nodeprep health --watch --apply`) with "
        "the join; false: the join writes none (uninstall still removes one)",
    ),
    Field(
        "health",
        "hold",
        integer(0, 86400),
        "Seconds a GPU must stay healthy before the health service reports it healthy again (no flapping)",
        flag="--health-hold", metavar="SECONDS",
        commands=("join",),
    ),
    # cluster
    Field(
        "cluster",
        "mode",
        enum("kubeadm", "kubelet"),
        "kubeadm: `kubeadm join` with a JoinConfiguration; kubelet: bootstrap kubeconfig + systemd drop-in",
    ),
    Field(
        "cluster",
        "api_server",
        string(check=api_server),
        "API server endpoint host:port, e.g. 10.0.0.10:6443",
        required=True,
        flag="--api-server",
        doc="API server endpoint host:port, e.g. 10.0.0.10:6443 (IPv6 in brackets)",
        commands=("join",),
    ),
    Field(
        "cluster",
        "token_file",
        string(check=abs_path),
        "File holding the bootstrap token (mode 0600; never put the token itself in the profile)",
        flag="--token-file",
        commands=("join", "cloud-init",),
    ),
    Field(
        "cluster",
        "ca_cert_hashes",
        list_of(string(CA_HASH_RE, "is not sha256:<64 hex digits>")),
        "Public key pins of the cluster CA (kubeadm token create --print-join-command shows them)",
        doc="Public key pins of the cluster CA (`sha256:<64 hex>`)",
    ),
    Field(
        "cluster",
        "ca_cert_file",
        string(check=abs_path),
        "Cluster CA certificate (PEM) for the kubelet bootstrap kubeconfig (mode kubelet)",
    ),
    Field(
        "cluster",
        "kubernetes_version",
        string(K8S_VERSION_RE, "is not a Kubernetes version (e.g. 1.31 or v1.31.2)", check=k8s_version),
        "Kubernetes version of the cluster: picks the kubeadm API (v1beta3 < 1.31 <= v1beta4) "
        "and kubelet flags",
        flag="--kubernetes-version",
        doc="Cluster version (`1.31`, `v1.31.2`): picks the kubeadm API and the kubelet flag rules; 1.27 "
        "or newer",
        commands=("join",),
    ),
    Field(
        "cluster",
        "node_name",
        string(check=node_name, nullable=True),
        "Node name (default: the host name)",
        flag="--node-name",
        commands=("join",),
    ),
    Field(
        "cluster",
        "taints",
        taints,
        "Taints set at registration (the only time a node may set its own taints)",
        doc="Taints set at registration: `key=value:Effect`, `key:Effect` or `{key, value, effect}`",
    ),
    Field(
        "cluster",
        "gpu_taint",
        boolean,
        "Add nvidia.com/gpu=present:NoSchedule at registration",
        doc="Add `nvidia.com/gpu=present:NoSchedule` at registration",
    ),
    Field(
        "cluster",
        "verify_gpus",
        boolean,
        "Register with nodeprep.dev/unverified:NoSchedule; nodeprep verify-nodes lifts it once the "
        "node's GPU self-test passed (docs/join.md)",
        doc="Register with `nodeprep.dev/unverified:NoSchedule`; `nodeprep verify-nodes` lifts it once the "
        "node's GPU self-test passed ([docs/join.md](join.md))",
    ),
    Field(
        "cluster",
        "cri_socket",
        string(re.compile(r"^unix:///.*$"), "must be a unix:// endpoint", check=cri_socket),
        "CRI endpoint of the container runtime",
    ),
    Field(
        "cluster",
        "cgroup_driver",
        enum("systemd", "cgroupfs"),
        "Kubelet cgroup driver; must match containerd's SystemdCgroup",
        doc="Kubelet cgroup driver; containerd's runc SystemdCgroup is aligned to it",
    ),
    Field(
        "cluster",
        "kubelet_extra_args",
        mapping(scalar_str, key_check=flag_name, pair_check=kubelet_arg),
        "Extra kubelet flags (name without dashes: value); deprecated ones move into KubeletConfiguration",
        doc="Extra kubelet flags (name without dashes: string value); see docs/join.md",
    ),
    Field(
        "cluster",
        "feature_gates",
        mapping(boolean, key_check=feature_gate),
        "Kubelet feature gates",
        doc="Kubelet feature gates (KubeletConfiguration.featureGates)",
    ),
    # runtime
    Field(
        "runtime",
        "containerd_config",
        string(check=abs_path),
        "containerd's main configuration file",
    ),
    Field(
        "runtime",
        "nvidia_runtime",
        boolean,
        "Register the `nvidia` runtime (nvidia-container-runtime)",
    ),
    Field(
        "runtime",
        "nvidia_runtime_path",
        string(check=abs_path),
        "Path of nvidia-container-runtime (NVIDIA Container Toolkit)",
    ),
    Field(
        "runtime",
        "cdi",
        boolean,
        "Write the CDI spec /etc/cdi/nvidia.yaml and enable CDI in containerd",
    ),
    Field(
        "runtime",
        "cdi_spec_dirs",
        list_of(string(check=abs_path)),
        "Directories containerd reads CDI specs from",
    ),
    Field(
        "runtime",
        "default_runtime",
        boolean,
        "Make `nvidia` containerd's default runtime",
    ),
    Field(
        "runtime",
        "cdi_hook_path",
        string(check=abs_path, nullable=True),
        "Path of NVIDIA's nvidia-cdi-hook, whose hooks the CDI spec then calls (default: found on the "
        "node's PATH; none: nodeprep's hook alone)",
    ),
)
REQUIRED_SECTIONS = ("driver",)
SECTION_HELP = {
    "driver": "Which driver to install and from where",
    "labels": "Node labels beyond the GPU facts",
    "cluster": "How to join Kubernetes (omit to skip joining)",
    "runtime": "Container runtime integration (containerd, CDI)",
    "mig": "MIG layout applied before the node joins (omit to leave MIG as it is)",
    "health": "The GPU health service the join installs (docs/node.md, \"GPU health\")",
}


def field_by_path(path: str) -> Field:
    for f in FIELDS:
        if f.path == path:
            return f
    raise KeyError(path)


def field_error(path: str, message: str, *, hint: str | None = None) -> InputError:
    """An InputError about field `path`, carrying its flag: the CLI shows `--flag: message`, the
    Ansible modules and bootstrap `section.key: message`."""
    return InputError(message, hint=hint, field=path, flag=field_by_path(path).flag)
