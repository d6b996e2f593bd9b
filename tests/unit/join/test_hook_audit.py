"""`nodeprep doctor`'s `hooks` check (nodeprep.runtime.hookaudit) on a node root, through the CLI: every
container hook a runtime would start with the container's environment is named with its file, be it
nodeprep's of before #35, NVIDIA's (nvidia-ctk before 1.17.8 wrote hooks without `env`; the H200's
real v1.20.0 spec in tests/fixtures/gpu-machine has one on every hook) or another tool's; the next
`nodeprep runtime` rewrites nodeprep's own. No GPU: the driver root is the join tests' node root."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.runtime import hookaudit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
H200_SPEC = FIXTURES / "gpu-machine/h200_580.159.04.nvidia-ctk.yaml"


def run(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code, r.stdout + r.stderr


def hooks_check(root: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    code, out = run(["doctor", "--root", str(root), "--check", "hooks", "--json"])
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    return code, checks["hooks"]


def strip_env(doc: object) -> object:
    """`doc` with every `env` of a hook removed: how the files looked before hooks had one."""
    if isinstance(doc, dict):
        return {k: strip_env(v) for k, v in doc.items() if not (k == "env" and ("path" in doc))}
    if isinstance(doc, list):
        return [strip_env(v) for v in doc]
    return doc


def test_doctor_names_each_hook_that_inherits_and_runtime_fixes_its_own(
        node_root: Path, tmp_path: Path, smi_xml: Path) -> None:
    profile = tmp_path / "node.yaml"
    profile.write_text(yaml.safe_dump({"driver": {"version": "535.309.01"},
                                       "runtime": {"default_runtime": True}}))
    runtime = ["runtime", "--profile", str(profile), "--root", str(node_root),
               "--nvidia-smi-xml", str(smi_xml)]
    assert run(runtime)[0] == 0
    (node_root / "var/run/cdi").mkdir(parents=True, exist_ok=True)
    (node_root / "var/run/cdi/nvidia-ctk.yaml").write_bytes(H200_SPEC.read_bytes())  # v1.20.0: env on each
    code, check = hooks_check(node_root)
    assert (code, check["ok"]) == (0, True), check

    spec = node_root / "etc/cdi/nvidia.yaml"
    hooks_d = node_root / "usr/share/containers/oci/hooks.d/99-nodeprep-cuda-gate.json"
    spec.write_text(yaml.safe_dump(strip_env(yaml.safe_load(spec.read_text()))))
    hooks_d.write_text(json.dumps(strip_env(json.loads(hooks_d.read_text()))))
    old_nvidia = node_root / "var/run/cdi/nvidia-ctk-1.17.7.yaml"
    old_nvidia.write_text(yaml.safe_dump(strip_env(yaml.safe_load(H200_SPEC.read_text()))))
    other = node_root / "etc/containerd/other-base.json"
    other.write_text(json.dumps({"hooks": {"createContainer": [{"path": "/usr/local/bin/x-hook"}],
                                           "prestart": [{"path": "/usr/local/bin/y-hook"}]}}))
    with (node_root / "etc/containerd/config.toml").open("a") as f:
        f.write('\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.other]\n'
                'runtime_type = "io.containerd.runc.v2"\n'
                'base_runtime_spec = "/etc/containerd/other-base.json"\n')
    code, check = hooks_check(node_root)
    assert (code, check["ok"]) == (1, False)
    message = check["message"]
    for line in ("/etc/cdi/nvidia.yaml: createContainer hook /usr/libexec/nodeprep/cdi-hook has no env",
                 "/usr/share/containers/oci/hooks.d/99-nodeprep-cuda-gate.json: createContainer hook "
                 "/usr/libexec/nodeprep/cdi-hook has no env",
                 "/var/run/cdi/nvidia-ctk-1.17.7.yaml: createContainer hook /usr/bin/nvidia-cdi-hook "
                 "has no env",
                 "/etc/containerd/other-base.json: createContainer hook /usr/local/bin/x-hook has no env"):
        assert line in message
    assert "y-hook" not in message  # prestart: started by the runtime, with its own environment
    assert "/var/run/cdi/nvidia-ctk.yaml" not in message

    assert run(runtime)[0] == 0  # the next runtime run rewrites nodeprep's own files
    code, check = hooks_check(node_root)
    assert code == 1 and "nodeprep" not in check["message"].replace("nodeprep runtime", "")
    old_nvidia.unlink()
    other.unlink()  # named but gone: not read, said so
    code, check = hooks_check(node_root)
    assert code == 1 and check["message"].endswith("/etc/containerd/other-base.json: file not found")


def test_a_fifo_or_a_link_out_of_the_root_is_named_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc/cdi").mkdir(parents=True)
    os.mkfifo(root / "etc/cdi/fifo.yaml")
    outside = tmp_path / "host-spec.yaml"
    outside.write_text(yaml.safe_dump({"containerEdits": {"hooks": [{"hookName": "createContainer",
                                                                     "path": "/host/hook"}]}}))
    (root / "etc/cdi/link.yaml").symlink_to(outside)
    found = hookaudit.inheriting_hooks(root)
    assert found == ["not read: /etc/cdi/fifo.yaml: not a regular file (a FIFO)",
                     "not read: /etc/cdi/link.yaml: file not found"], found  # resolved beneath the root
