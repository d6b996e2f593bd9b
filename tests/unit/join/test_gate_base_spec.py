"""containerd's base spec for the CUDA gate, rendered from a default spec as `ctr oci spec` prints it
(the real starts through it: tests/slow/join/test_cuda_gate_cri.py)."""

from __future__ import annotations

import json
import tomllib

from nodeprep.profile import Runtime
from nodeprep.runtime import containerd as ctd
from nodeprep.runtime import ocihooks

DEFAULT = {  # `ctr oci spec` of containerd 2.1.9, abridged
    "ociVersion": "1.2.1", "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/"}, "root": {"path": "rootfs"},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    "linux": {"cgroupsPath": "/default", "namespaces": [{"type": "pid"}]},
}
KEY = "io.containerd.grpc.v1.cri"


def test_base_spec_adds_the_gate_once_and_drops_the_shared_cgroup() -> None:
    hook = ocihooks.gate_hook()
    spec = json.loads(ctd.render_base_spec(DEFAULT, hook))
    assert spec["hooks"] == {"createContainer": [hook]}
    assert "cgroupsPath" not in spec["linux"] and spec["mounts"] == DEFAULT["mounts"]
    again = json.loads(ctd.render_base_spec(spec, hook))  # re-rendered from its own output: still once
    assert again["hooks"] == {"createContainer": [hook]}


def test_drop_in_points_runc_handlers_at_the_base_spec_and_keeps_a_handler_s_own() -> None:
    main = {"version": 2, "plugins": {KEY: {"containerd": {"runtimes": {
        "runc": {"runtime_type": "io.containerd.runc.v2"},
        "mine": {"runtime_type": "io.containerd.runc.v2", "base_runtime_spec": "/etc/mine.json"},
        "kata": {"runtime_type": "io.containerd.kata.v2"},
    }}}}}
    warnings: list[str] = []
    target = ctd.base_spec_target("/etc/containerd/config.toml")
    text = ctd.render_drop_in(main, 2, Runtime(), None, "/etc/containerd/config.toml", warnings, target)
    runtimes = tomllib.loads(text.decode())["plugins"][KEY]["containerd"]["runtimes"]
    assert target == "/etc/containerd/nodeprep-base-spec.json"
    assert runtimes["runc"]["base_runtime_spec"] == target
    assert runtimes["nvidia"]["base_runtime_spec"] == target
    assert runtimes["mine"]["base_runtime_spec"] == "/etc/mine.json"
    assert "base_runtime_spec" not in runtimes["kata"]
    assert warnings == ["containerd runtime 'mine' keeps its base_runtime_spec /etc/mine.json: the CUDA gate "
                        "does not run for its containers"]


def test_no_containerd_version_in_the_root_no_base_spec_and_a_warning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "etc/containerd").mkdir(parents=True)
    warnings: list[str] = []
    files = ctd.plan_containerd(tmp_path, Runtime(), None, warnings, ocihooks.gate_hook())
    assert [f.target for f in files] == ["/etc/containerd/config.toml",
                                         "/etc/containerd/conf.d/99-nodeprep-nvidia.toml"]
    assert b"base_runtime_spec" not in files[1].content
    assert any(w.startswith("containerd base spec not written (containerd's version is not known: no "
                            "containerd or containerd.io package in /var/lib/dpkg/status") for w in warnings)
