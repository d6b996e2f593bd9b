"""The service's files, as `nodeprep join` writes them (nodeprep.join.joinplan) and `nodeprep uninstall`
takes them back (nodeprep.join.removal: both start with nodeprep's header):

- /etc/systemd/system/nodeprep-health.service, `nodeprep health --watch --apply` with the kubelet's
  own kubeconfig, restarted whenever it stops (also while the kubelet has not bootstrapped yet);
- /etc/systemd/system/kubelet.service.d/20-nodeprep-health.conf, `Wants=nodeprep-health.service`:
  the kubelet pulls the service in, so no enablement link is made (nothing for uninstall to find).
"""

from __future__ import annotations

UNIT = "nodeprep-health.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
DROP_IN_PATH = "/etc/systemd/system/kubelet.service.d/20-nodeprep-health.conf"
NODEPREP_BIN = "/usr/local/bin/nodeprep"
KUBECONFIG = "/etc/kubernetes/kubelet.conf"
HEADER = "# Written by nodeprep"


def render_unit(*, hold: float = 60.0, xid_window: float = 3600.0) -> str:
    argv = [NODEPREP_BIN, "health", "--watch", "--apply", "--kubeconfig", KUBECONFIG,
            "--hold", f"{hold:g}", "--xid-window", f"{xid_window:g}"]
    return f"""{HEADER} (nodeprep join; nodeprep uninstall removes it). docs/node.md "GPU health".
[Unit]
Description=nodeprep GPU health: NVML and Xid events to the Node condition GPUHealthy
After=kubelet.service nvidia-persistenced.service
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart={" ".join(argv)}
Restart=always
RestartSec=10
Nice=10
CPUQuota=10%
MemoryMax=128M
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
"""


def render_drop_in() -> str:
    return f"""{HEADER} (nodeprep join; nodeprep uninstall removes it): the kubelet wants the GPU health
# service, so it starts with the kubelet and no enablement link is made.
[Unit]
Wants={UNIT}
"""


def files(*, hold: float = 60.0) -> list[tuple[str, bytes]]:
    """(node path, bytes) of the service's files (`hold`: the profile's health.hold)."""
    return [(UNIT_PATH, render_unit(hold=hold).encode()), (DROP_IN_PATH, render_drop_in().encode())]
