"""Driver upgrades across a fleet: the per-node state machine, which pods go, batch planning, who
cordoned (pure), the Kubernetes side (cluster.py) and the node's reload-or-reboot decision (reload.py).
docs/fleet.md, "Upgrades"."""
