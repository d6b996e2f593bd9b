"""`nodeprep join` end to end under a temporary root, parsed back.

No kubeadm binary or API server exists here, so these tests exercise what a join writes and would
run (a join into an offline --root, which writes the files and defers kubeadm to the booted node;
--dry-run, which changes nothing; plan_join) and never the join itself: the rendered JoinConfiguration,
KubeletConfiguration, bootstrap kubeconfig and kubelet drop-in are parsed back and checked field by
field, and the bootstrap token is looked for everywhere it must not be (argv, stdout, stderr,
--json, log records). GPU facts come from a real `nvidia-smi -q -x` capture (no GPU here); the
driver root is built with the real artifact code (see conftest.py).
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.errors import InputError
from nodeprep.join.apply import apply_join
from nodeprep.join.joinplan import JoinOptions, plan_join
from nodeprep.profile import parse_profile

from .conftest import CA_HASH, TOKEN, mode_of, write_token

SECRET = TOKEN.split(".")[1]


def profile(tmp_path: Path, **cluster: Any) -> Path:
    data: dict[str, Any] = {
        "driver": {"version": "535.309.01"},
        "labels": {"extra": {"example.com/team": "ml", "node.kubernetes.io/pool": "gpu-a"}, "cloud": "none"},
        "cluster": {
            "api_server": "10.0.0.10:6443",
            "ca_cert_hashes": [CA_HASH],
            "gpu_taint": True,
            "kubernetes_version": "1.31",
            "taints": ["dedicated=gpu:NoSchedule"],
            "kubelet_extra_args": {"max-pods": "110", "node-ip": "10.0.0.21"},
            **cluster,
        },
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_join(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def join_args(node_root: Path, prof: Path, smi_xml: Path, *extra: str) -> list[str]:
    return [
        "join",
        "--profile",
        str(prof),
        "--root",
        str(node_root),
        "--skip-preflight",
        "--skip-discovery",  # no API server here: never contact the profile's (non-loopback) address
        "--nvidia-smi-xml",
        str(smi_xml),
        *extra,
    ]


def _plan(node_root: Path, prof: Path, smi_xml: Path, **kw: Any):  # type: ignore[no-untyped-def]
    p = parse_profile(yaml.safe_load(prof.read_text()), str(prof))
    return plan_join(p, JoinOptions(root=node_root, skip_preflight=True, nvidia_smi_xml=smi_xml, **kw))


def test_v1beta3_below_1_31(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    code, _, _ = run_join(
        join_args(node_root, profile(tmp_path, kubernetes_version="1.30"), smi_xml)
    )
    assert code == 0
    doc = yaml.safe_load((node_root / "etc/nodeprep/kubeadm-join.yaml").read_text())
    assert doc["apiVersion"] == "kubeadm.k8s.io/v1beta3" and doc["kind"] == "JoinConfiguration"
    reg = doc["nodeRegistration"]
    args = reg["kubeletExtraArgs"]
    assert isinstance(args, dict)  # v1beta3: map form
    assert args["node-ip"] == "10.0.0.21"
    assert "max-pods" not in args  # deprecated flag moved into KubeletConfiguration
    labels = dict(kv.split("=", 1) for kv in args["node-labels"].split(","))
    assert labels["example.com/team"] == "ml" and labels["node.kubernetes.io/pool"] == "gpu-a"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-RTX-A5000" and labels["nvidia.com/gpu.count"] == "2"
    assert reg["taints"] == [
        {"key": "dedicated", "effect": "NoSchedule", "value": "gpu"},
        {"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"},
        {"key": "nodeprep.dev/unverified", "effect": "NoSchedule"},
    ]
    assert reg["criSocket"] == "unix:///run/containerd/containerd.sock"
    disc = doc["discovery"]
    assert disc["bootstrapToken"] == {
        "apiServerEndpoint": "10.0.0.10:6443",
        "token": TOKEN,
        "caCertHashes": [CA_HASH],
    }
    assert disc["timeout"] == "5m0s" and "timeouts" not in doc
    assert doc["patches"] == {"directory": "/etc/nodeprep/kubeadm-patches"}
    patch = yaml.safe_load(
        (node_root / "etc/nodeprep/kubeadm-patches/kubeletconfiguration+merge.yaml").read_text()
    )
    assert patch == {
        "cgroupDriver": "systemd",
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "maxPods": 110,
    }


def test_v1beta4_from_1_31(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    code, _, _ = run_join(
        join_args(
            node_root,
            profile(tmp_path, kubernetes_version="v1.31.2", node_name="gpu-1"),
            smi_xml,
        )
    )
    assert code == 0
    doc = yaml.safe_load((node_root / "etc/nodeprep/kubeadm-join.yaml").read_text())
    assert doc["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    reg = doc["nodeRegistration"]
    assert reg["name"] == "gpu-1"
    args = reg["kubeletExtraArgs"]
    assert isinstance(args, list) and all(set(a) == {"name", "value"} for a in args)  # v1beta4: list form
    assert [a["name"] for a in args] == ["node-ip", "node-labels"]
    assert doc["timeouts"]["discovery"] == "5m0s" and "timeout" not in doc["discovery"]
    assert doc["discovery"]["tlsBootstrapToken"] == TOKEN


def test_secrets_are_0600_and_never_printed(
    node_root: Path, tmp_path: Path, smi_xml: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    prof = profile(tmp_path)
    code, out, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 0
    assert "# ---- /etc/nodeprep/kubeadm-join.yaml (mode 0600, new, secret)" in out
    assert "token: <redacted>" in out and "k9x2mq.****************" not in out
    code, js, err2 = run_join(join_args(node_root, prof, smi_xml, "--json"))
    assert code == 0
    data = json.loads(js)
    assert data["token"] == "k9x2mq.****************"
    for text in (out, err, js, err2, caplog.text, *(r.getMessage() for r in caplog.records)):
        assert SECRET not in text and TOKEN not in text
    join_file = node_root / "etc/nodeprep/kubeadm-join.yaml"
    assert mode_of(join_file) == 0o600 and TOKEN in join_file.read_text()
    secret_files = [f["path"] for f in data["files"] if f["secret"]]
    assert secret_files == ["/etc/nodeprep/kubeadm-join.yaml"]
    assert all(f["sha256"] is None for f in data["files"] if f["secret"])


def test_command_line_holds_no_token(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    plan = _plan(node_root, profile(tmp_path), smi_xml)
    joins = [a for a in plan.actions if a.argv[:2] == ("kubeadm", "join")]
    assert [list(a.argv) for a in joins] == [
        ["kubeadm", "join", "--config", "/etc/nodeprep/kubeadm-join.yaml"]
    ]
    assert joins[0].deferred  # --root is not the live system: printed for first boot, not run
    for a in plan.actions:
        assert all(SECRET not in arg for arg in a.argv)
    assert SECRET not in repr(plan) and SECRET not in json.dumps(plan.to_dict())


def test_second_run_changes_nothing(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = profile(tmp_path)
    code, js, _ = run_join(join_args(node_root, prof, smi_xml, "--json"))
    first = json.loads(js)
    assert code == 0 and first["changed"] is True and len(first["written"]) == 11
    snapshot = {p: p.read_bytes() for p in node_root.rglob("*") if p.is_file()}
    code, js, _ = run_join(join_args(node_root, prof, smi_xml, "--json"))
    second = json.loads(js)
    assert code == 0 and second["changed"] is False and second["written"] == []
    assert all(not f["changed"] for f in second["files"])
    assert {p: p.read_bytes() for p in node_root.rglob("*") if p.is_file()} == snapshot


def test_missing_ca_pins_need_the_insecure_flag(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = profile(tmp_path, ca_cert_hashes=[])
    code, out, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 2 and out == ""
    assert err.splitlines()[0].startswith(
        f"error: {prof}: cluster.ca_cert_hashes: required in mode kubeadm to verify the cluster CA")
    assert not (node_root / "etc/nodeprep/kubeadm-join.yaml").exists()  # nothing written
    code, _, _ = run_join(join_args(node_root, prof, smi_xml, "--insecure-skip-ca-verification"))
    assert code == 0
    boot = yaml.safe_load((node_root / "etc/nodeprep/kubeadm-join.yaml").read_text())["discovery"][
        "bootstrapToken"
    ]
    assert boot["unsafeSkipCAVerification"] is True and "caCertHashes" not in boot


@pytest.mark.parametrize(
    ("mode", "content", "message"),
    [
        pytest.param(
            0o644,
            TOKEN,
            "has mode 0644; the bootstrap token must not be readable by group or others",
            id="world-readable",
        ),
        pytest.param(0o640, TOKEN, "has mode 0640", id="group-readable"),
        pytest.param(0o600, "K9X2MQ.7f3a9c0d1e5b8a24", "not a bootstrap token", id="upper-case"),
        pytest.param(0o600, "k9x2mq7f3a9c0d1e5b8a24", "not a bootstrap token", id="no-dot"),
    ],
)
def test_token_file_is_checked(
    node_root: Path, tmp_path: Path, smi_xml: Path, mode: int, content: str, message: str
) -> None:
    write_token(node_root, mode, content)
    code, out, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--check"))
    assert code == 2 and message in err
    assert content not in err and content.split(".")[-1] not in err  # the bad token is not echoed
    assert not (node_root / "etc/nodeprep/kubeadm-join.yaml").exists()


def test_token_mode_hint_names_the_file_under_root(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    """The error names the node's path; the hint's command must work here, so it joins --root."""
    write_token(node_root, 0o644, TOKEN)
    code, _, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--check"))
    assert code == 2
    assert err.splitlines()[0].startswith(
        "error: cluster.token_file: /etc/nodeprep/bootstrap-token has mode 0644")
    assert err.splitlines()[1] == f"  chmod 0600 {node_root}/etc/nodeprep/bootstrap-token"


def test_missing_token_file(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    (node_root / "etc/nodeprep/bootstrap-token").unlink()
    code, _, err = run_join(join_args(node_root, profile(tmp_path), smi_xml, "--check"))
    assert code == 2
    assert err.splitlines()[0] == "error: cluster.token_file: /etc/nodeprep/bootstrap-token does not exist"


def test_labels_that_cannot_be_self_set_refuse_the_join(
    node_root: Path, tmp_path: Path, smi_xml: Path
) -> None:
    prof = profile(tmp_path)
    data = yaml.safe_load(prof.read_text())
    data["labels"]["extra"]["node-role.kubernetes.io/gpu"] = ""
    prof.write_text(yaml.safe_dump(data))
    code, _, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 2
    assert "labels.extra: cannot be set by the kubelet at registration" in err
    assert "node-role.kubernetes.io/gpu" in err


def test_removed_flag_is_refused_with_version(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = profile(tmp_path, kubelet_extra_args={"keep-terminated-pod-volumes": "true"})
    code, _, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 2
    assert ("--keep-terminated-pod-volumes was removed in Kubernetes 1.31 (cluster is 1.31)") in err
    prof = profile(
        tmp_path, kubelet_extra_args={"keep-terminated-pod-volumes": "true"}, kubernetes_version="1.30"
    )
    code, _, _ = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 0


def test_preflight_refuses_when_doctor_fails(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    """No kernel module is loaded here (no GPU), so doctor() fails on this root: `--check` still
    prints the whole plan with the findings in it (exit 0, nothing written); only the real join
    refuses with one `error: preflight failed` line and writes nothing."""
    pytest.importorskip("nodeprep.node.doctor")
    args = [a for a in join_args(node_root, profile(tmp_path), smi_xml) if a != "--skip-preflight"]
    code, out, err = run_join([*args, "--check"])
    assert code == 0, err
    assert "# ---- /etc/nodeprep/kubeadm-join.yaml (mode 0600, new, secret)" in out
    assert "# preflight (a real join refuses): nodeprep doctor failed: " in out
    assert "warning: preflight: nodeprep doctor failed: " in err and "error:" not in err
    code, js, _ = run_join([*args, "--check", "--json"])
    assert code == 0 and json.loads(js)["preflight"][0].startswith("nodeprep doctor failed: ")
    assert not (node_root / "etc/nodeprep/kubeadm-join.yaml").exists()
    code, _, err = run_join(args)
    assert code == 1
    assert err.startswith("error: preflight failed: nodeprep doctor failed: ")
    assert not (node_root / "etc/nodeprep/kubeadm-join.yaml").exists()


def test_mode_kubelet(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    ca = node_root / "etc/kubernetes/pki/ca.crt"
    ca.parent.mkdir(parents=True)
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    prof = profile(
        tmp_path,
        mode="kubelet",
        kubernetes_version="1.29",
        feature_gates={"KubeletCgroupDriverFromCRI": True},
        kubelet_extra_args={
            "max-pods": "64",
            "node-ip": "10.0.0.21",
            "eviction-hard": "memory.available<500Mi",
        },
    )
    plan = _plan(node_root, prof, smi_xml)
    assert plan.kubeadm_api is None
    assert [list(a.argv) for a in plan.actions] == [
        ["env", "SYSTEMCTL_SKIP_SYSV=1", "systemctl", f"--root={node_root}", "enable", "kubelet.service"]
    ]
    result = apply_join(plan, run=False)
    assert result["ran"] == []
    kubeconfig = node_root / "etc/kubernetes/bootstrap-kubelet.conf"
    assert mode_of(kubeconfig) == 0o600
    kc = yaml.safe_load(kubeconfig.read_text())
    assert kc["users"][0]["user"]["token"] == TOKEN
    assert kc["clusters"][0]["cluster"] == {
        "server": "https://10.0.0.10:6443",
        "certificate-authority": "/etc/kubernetes/pki/ca.crt",
    }
    cfg = yaml.safe_load((node_root / "var/lib/kubelet/config.yaml").read_text())
    assert cfg["apiVersion"] == "kubelet.config.k8s.io/v1beta1" and cfg["kind"] == "KubeletConfiguration"
    assert cfg["cgroupDriver"] == "systemd"
    assert cfg["containerRuntimeEndpoint"] == "unix:///run/containerd/containerd.sock"
    assert cfg["registerWithTaints"][-2:] == [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"},
        {"key": "nodeprep.dev/unverified", "effect": "NoSchedule"},
    ]
    assert cfg["maxPods"] == 64 and cfg["evictionHard"] == {"memory.available": "500Mi"}
    assert cfg["featureGates"] == {"KubeletCgroupDriverFromCRI": True}
    assert "nodeLabels" not in cfg  # not a KubeletConfiguration field
    drop_in = (node_root / "etc/systemd/system/kubelet.service.d/10-nodeprep.conf").read_text()
    assert TOKEN not in drop_in and SECRET not in drop_in
    exec_start = [line for line in drop_in.replace("\\\n", " ").splitlines() if line.startswith("ExecStart=")]
    assert exec_start[0] == "ExecStart="  # reset the packaged ExecStart
    argv = shlex.split(exec_start[1].removeprefix("ExecStart="))
    flags = dict(a[2:].split("=", 1) for a in argv[1:])
    assert argv[0] == "/usr/bin/kubelet"
    assert flags["bootstrap-kubeconfig"] == "/etc/kubernetes/bootstrap-kubelet.conf"
    assert flags["kubeconfig"] == "/etc/kubernetes/kubelet.conf"
    assert flags["config"] == "/var/lib/kubelet/config.yaml"
    assert flags["node-ip"] == "10.0.0.21" and "max-pods" not in flags
    labels = dict(kv.split("=", 1) for kv in flags["node-labels"].split(","))
    assert labels["example.com/team"] == "ml" and labels["nvidia.com/gpu.count"] == "2"


def test_mode_kubelet_needs_ca_file(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = profile(tmp_path, mode="kubelet")
    with pytest.raises(InputError, match="cluster.ca_cert_file: /etc/kubernetes/pki/ca.crt does not exist"):
        _plan(node_root, prof, smi_xml)
    plan = _plan(node_root, prof, smi_xml, insecure_skip_ca_verification=True)
    kc = yaml.safe_load(next(f for f in plan.files if f.target.endswith("bootstrap-kubelet.conf")).content)
    assert kc["clusters"][0]["cluster"]["insecure-skip-tls-verify"] is True


def test_profile_without_cluster(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text("driver: {version: '535.309.01'}\n")
    code, _, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 2 and "no cluster section; nothing to join" in err


def test_default_profile_path_under_root(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    code, _, err = run_join(["join", "--root", str(node_root), "--check", "--skip-preflight"])
    assert code == 2 and f"{node_root}/etc/nodeprep/node.yaml: file not found" in err


def test_flags_override_the_profile(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = profile(tmp_path, kubernetes_version="1.31")
    args = join_args(
        node_root, prof, smi_xml, "--kubernetes-version", "1.29", "--node-name", "gpu-7"
    )
    code, _, _ = run_join(args)
    assert code == 0
    doc = yaml.safe_load((node_root / "etc/nodeprep/kubeadm-join.yaml").read_text())
    assert doc["apiVersion"] == "kubeadm.k8s.io/v1beta3" and doc["nodeRegistration"]["name"] == "gpu-7"
    code, _, err = run_join(join_args(node_root, prof, smi_xml, "--check", "--api-server", "nope"))
    assert code == 2 and "cluster.api_server: 'nope' must be host:port" in err


def test_flags_nodeprep_owns_are_refused(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = profile(
        tmp_path, kubelet_extra_args={"register-with-taints": "a=b:NoSchedule", "node-labels": "x=y"}
    )
    code, _, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 2
    assert (
        "cluster.kubelet_extra_args: register-with-taints: set by nodeprep from the profile; "
        "use cluster.taints" in err
    )
    assert ("cluster.kubelet_extra_args: node-labels: set by nodeprep from the profile; "
            "use labels.extra") in err


def test_cdi_feature_gate_on_1_28_only(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    plan = _plan(node_root, profile(tmp_path, kubernetes_version="1.28"), smi_xml)
    patch = yaml.safe_load(next(f for f in plan.files if f.target.endswith("+merge.yaml")).content)
    assert patch["featureGates"] == {"DevicePluginCDIDevices": True}
    plan = _plan(node_root, profile(tmp_path, kubernetes_version="1.29"), smi_xml)
    patch = yaml.safe_load(next(f for f in plan.files if f.target.endswith("+merge.yaml")).content)
    assert "featureGates" not in patch
    # 1.27's kubelet does not know the gate (added in 1.28) and would refuse to start with it
    plan = _plan(node_root, profile(tmp_path, kubernetes_version="1.27"), smi_xml)
    patch = yaml.safe_load(next(f for f in plan.files if f.target.endswith("+merge.yaml")).content)
    assert "featureGates" not in patch


def test_rotated_token_never_shows_the_old_one(node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    prof = profile(tmp_path)
    assert run_join(join_args(node_root, prof, smi_xml))[0] == 0
    write_token(node_root, 0o600, "newtok.1111222233334444")
    code, out, err = run_join(join_args(node_root, prof, smi_xml, "--check"))
    assert code == 0 and "(mode 0600, changed, secret)" in out
    for secret in (SECRET, "1111222233334444"):
        assert secret not in out and secret not in err


def test_the_annotated_example_joins(node_root: Path, smi_xml: Path) -> None:
    """examples/node.yaml as shipped (cloud: auto finds no DMI under the temp root: no metadata query)."""
    example = Path(__file__).resolve().parents[3] / "examples" / "node.yaml"
    code, js, _ = run_join(join_args(node_root, example, smi_xml, "--check", "--json"))
    assert code == 0
    data = json.loads(js)
    assert data["kubeadm_api"] == "kubeadm.k8s.io/v1beta4"
    assert data["taints"] == ["dedicated=gpu:NoSchedule", "nvidia.com/gpu=present:NoSchedule",
                             "nodeprep.dev/unverified:NoSchedule"]
    assert data["moved_flags"] == ["max-pods"]
    assert data["labels"]["node.kubernetes.io/pool"] == "gpu-a" and data["api_labels"] == {}


def test_token_given_in_memory_is_planned_without_a_file(
    node_root: Path, tmp_path: Path, smi_xml: Path
) -> None:
    """JoinOptions.token (what Ansible's check mode has before it writes the file): the plan uses it,
    and the token file is neither needed nor written by planning."""
    from nodeprep.join.token import parse_token

    token_file = node_root / "etc/nodeprep/bootstrap-token"
    token_file.unlink()
    other = "zz0000.0123456789abcdef"
    plan = _plan(node_root, profile(tmp_path), smi_xml, token=parse_token(other, source="token"))
    (join_cfg,) = [f for f in plan.files if f.target == "/etc/nodeprep/kubeadm-join.yaml"]
    assert yaml.safe_load(join_cfg.content)["discovery"]["bootstrapToken"]["token"] == other
    assert join_cfg.secret and not token_file.exists()
    options = JoinOptions(token=parse_token(other, source="t"))
    assert other not in repr(plan) and other.split(".")[1] not in repr(options)
