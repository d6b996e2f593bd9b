"""What a join plan reads from the node besides the files it writes: the bootstrap token, the
cluster CA file, whether the node has joined, its labels, doctor's verdict and containerd's version.
The edge of nodeprep.join.joinplan: each probe is one read (or one command, through nodeprep.runner),
and the planners there take what it found as explicit input.
"""

from __future__ import annotations

from pathlib import Path

from ..profile import Cluster, Profile
from ..runtime.files import under
from . import kube
from .token import BootstrapToken, read_token_file


def token(root: Path, cluster: Cluster) -> BootstrapToken:
    """The bootstrap token in cluster.token_file under root (InputError when the file is unsafe)."""
    return read_token_file(under(root, cluster.token_file, input_field="cluster.token_file"),
                           shown_as=cluster.token_file)


def ca_cert_present(root: Path, cluster: Cluster) -> bool:
    return under(root, cluster.ca_cert_file).is_file()


def ca_cert_pem(root: Path, cluster: Cluster) -> bytes:
    return under(root, cluster.ca_cert_file).read_bytes()


def joined(root: Path) -> bool:
    """The kubelet's kubeconfig exists: the node has joined already."""
    return under(root, kube.KUBECONFIG).exists()


def node_labels(profile: Profile, root: Path, *,
                nvidia_smi_xml: Path | None) -> tuple[dict[str, str], list[str]]:
    """The node's labels (nodeprep.labels.core.node_labels, the root's facts by
    nodeprep.labels.options.label_options) and their warnings."""
    # lazy: Ansible nodeprep_join, Ansible nodeprep_runtime
    from ..labels.core import node_labels as compute
    from ..labels.options import label_options
    from ..labels.profilelabels import ProfileLabels

    result = compute(label_options(root, ProfileLabels.of(profile), nvidia_smi_xml=nvidia_smi_xml))
    return dict(result.labels), list(result.warnings)


def doctor_problems(root: Path) -> list[str]:
    """`nodeprep doctor` on the root: one line naming every failed check, or nothing."""
    try:
        # lazy: Ansible nodeprep_join, Ansible nodeprep_runtime
        from ..node.doctor import doctor
    except ImportError:
        return ["nodeprep.node.doctor is not available in this installation"]
    report = doctor(Path(root))
    if getattr(report, "ok", False):
        return []
    problems = getattr(report, "problems", None)
    details = problems() if callable(problems) else (problems or [])
    text = (
        "; ".join(f"{getattr(c, 'name', '?')}: {getattr(c, 'message', c)}" for c in details)
        or "see `nodeprep doctor`"
    )
    return [f"nodeprep doctor failed: {text}"]


#END
