"""The label settings of a node profile: `labels.extra`, `labels.cloud`, `labels.mig_strategy`,
`cluster.node_name` and the kernel it describes (`driver.kernel`).

Read with the one profile loader (nodeprep.profile.load_profile), so `labels` refuses exactly what
`profile check`, `join` and `cloud-init` refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..profile import Profile, load_profile


@dataclass(frozen=True)
class ProfileLabels:
    extra: dict[str, str] = field(default_factory=dict)
    cloud: str = "auto"
    node_name: str | None = None
    kernel: str | None = None  # None: the running kernel on /, the root's under --root
    mig_strategy: str = "none"  # labels.mig_strategy (GFD's --mig-strategy)

    @classmethod
    def of(cls, p: Profile) -> ProfileLabels:
        return cls(extra=dict(p.labels.extra), cloud=p.labels.cloud,
                   node_name=p.cluster.node_name if p.cluster is not None else None, kernel=p.driver.kernel,
                   mig_strategy=p.labels.mig_strategy)


def profile_labels(path: Path) -> ProfileLabels:
    return ProfileLabels.of(load_profile(path))
