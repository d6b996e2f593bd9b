"""One profile, three front-ends, one plan: `nodeprep install --check --json`, bootstrap's driver
step in check mode and nodeprep.fleet.nodeprep_driver in check mode (run by ansible-core, the
library from this checkout) plan the same install for the same profile on the same image root,
because each is one call of nodeprep.node.driververbs.install_driver; likewise uninstall
(node.driververbs.uninstall_node), labels (node.labeling.label_node), the runtime and the join
(runtime.configure.configure_runtime, join.joining.join_cluster), table-driven below; the labels'
front-ends also record the same GPU facts file (label_node records it, in check mode plans it).

The store is a directory of small real artifacts (tests/support/standin.py) served over loopback
http, so the store client reads the profile's credentials file; that file is the node's (in the
image, beneath --root), which this machine does not have: a front-end that read it on this machine
fails or plans otherwise. The driver verbs use nothing GPU-like (no NVML mock, no capture); the
others read a recorded `nvidia-smi -q -x` capture (no NVML mock, no GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeprep.bootstrap.steps import Context, Options, step_driver
from nodeprep.errors import NodeprepError
from nodeprep.profile.load import load_profile
from tests.support.clirunner import separate_stderr
from tests.support.httpdir import serve_directory
from tests.support.standin import KERNEL, standin_store, tree

VERSION = "535.309.01"


def _cli(root: Path, profile: Path) -> dict[str, Any]:
    from nodeprep.cli import main

    r = separate_stderr().invoke(main, ["install", "--root", str(root), "--profile", str(profile),
                                        "--activate", "--check", "--json"])
    return dict(json.loads(r.stdout)) if r.exit_code == 0 else {"failed": r.stderr.strip()}


def _bootstrap(root: Path, profile: Path) -> dict[str, Any]:
    ctx = Context(root=root, profile=load_profile(profile), profile_path=profile, digest="",
                  options=Options(check=True))
    try:
        data = step_driver(ctx)
    except NodeprepError as e:
        return {"failed": str(e)}
    data.pop("summary")
    return data


def _ansible(root: Path, profile: Path) -> dict[str, Any]:
    from tests.unit.fleet.test_module_sequence import module

    driver = yaml.safe_load(profile.read_text())["driver"]
    status, result = module("nodeprep_driver", {"root": str(root), "state": "active", **driver}, check=True)
    return dict(result["plan"]) if status in ("CHANGED", "SUCCESS") else {"failed": result.get("msg")}


FRONT_ENDS = {"cli": _cli, "bootstrap": _bootstrap, "ansible": _ansible}

# the profile's driver section beyond the store, the kernel and the credentials file
PROFILES = {
    "pinned": {"version": VERSION},
    "branch": {"branch": "535", "keep_boot_kernel": True},
    "pinned-modules": {"version": VERSION, "branch_policy": "oldest", "modules": ["nvidia", "nvidia-uvm"]},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("frontends")
    store = standin_store(work / "work", work / "store", VERSION)
    with serve_directory(store) as url:
        yield url


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_three_front_ends_plan_the_same_install(name: str, served: str, tmp_path: Path) -> None:
    pytest.importorskip("ansible")
    root = tmp_path / "image"
    # the node's credentials file: only in the image (a name this machine has no file at)
    auth = f"/etc/nodeprep/registry-auth-{tmp_path.name}.json"
    on_node = root / auth.lstrip("/")
    on_node.parent.mkdir(parents=True)
    on_node.write_text('{"auths": {}}\n')
    on_node.chmod(0o600)
    assert not Path(auth).exists()
    driver = {"store": served, "kernel": KERNEL, "registry_auth": auth, **PROFILES[name]}
    profile = root / "etc/nodeprep/node.yaml"
    profile.write_text(yaml.safe_dump({"driver": driver}))
    before = tree(root)
    plans = {fe: run(root, profile) for fe, run in FRONT_ENDS.items()}
    assert tree(root) == before  # check mode everywhere: nothing written
    assert all("failed" not in plan for plan in plans.values()), plans
    assert plans["cli"]["install_userspace"] and plans["cli"]["version"] == VERSION, plans["cli"]
    assert plans["cli"]["kernel_hook"]["record"]["registry_auth"] == auth  # as the booted node sees it
    assert plans["bootstrap"] == plans["cli"]
    assert plans["ansible"] == plans["cli"]


# The other verbs: uninstall, label, configure the runtime, join. The node root is a real one (an
# installed driver unpacked from a real artifact, tests/unit/join/conftest.py) with a profile in its
# /etc/nodeprep/node.yaml; GPU facts come from a recorded `nvidia-smi -q -x` capture (no NVML mock,
# no GPU). Each front-end's answer is cut to the plan the verb's one use case made.
NODE_PROFILE = {
    "driver": {"version": VERSION, "kernel": KERNEL},
    "labels": {"extra": {"example.com/team": "ml"}, "cloud": "none", "mig_strategy": "single"},
    "runtime": {"default_runtime": True},
    "cluster": {"api_server": "10.0.0.10:6443", "ca_cert_hashes": ["sha256:" + "0f" * 32],
                "kubernetes_version": "1.31", "taints": ["dedicated=gpu:NoSchedule"]},
}
PROFILE_AT = "/etc/nodeprep/node.yaml"
# what a join's preview adds to the plan (JoinPlan.to_dict()), and what bootstrap adds to a step's
PREVIEW_KEYS = ("written", "ran", "preview", "dry_run", "check", "summary")


def _cli_json(args: list[str]) -> Any:
    from nodeprep.cli import main

    r = separate_stderr().invoke(main, args)
    return json.loads(r.stdout) if r.exit_code == 0 else {"failed": r.stderr.strip()}


def _step(name: str, root: Path, xml: Path) -> Any:
    from nodeprep.bootstrap import steps

    profile = root / PROFILE_AT.lstrip("/")
    ctx = Context(root=root, profile=load_profile(profile), profile_path=profile, digest="",
                  options=Options(check=True, nvidia_smi_xml=xml))
    try:
        return getattr(steps, f"step_{name}")(ctx)
    except NodeprepError as e:
        return {"failed": str(e)}


def _task(name: str, args: dict[str, Any], check: bool = True) -> Any:
    from tests.unit.fleet.test_module_sequence import module

    status, result = module(name, args, check=check)
    return result if status in ("CHANGED", "SUCCESS") else {"failed": result.get("msg")}


def _cut(data: Any, key: str | None = None) -> Any:
    if "failed" in data:
        return data
    data = data[key] if key else data
    return {k: v for k, v in data.items() if k not in PREVIEW_KEYS}


def _runtime(fe: str, root: Path, xml: Path) -> Any:
    if fe == "cli":
        out = _cli_json(["runtime", "--root", str(root), "--profile", str(root / PROFILE_AT.lstrip("/")),
                         "--nvidia-smi-xml", str(xml), "--check", "--json"])
    elif fe == "bootstrap":
        out = _step("runtime", root, xml)
    else:
        out = _task("nodeprep_runtime", {"root": str(root), "profile": PROFILE_AT,
                                         "nvidia_smi_xml": str(xml)})
    return out if "failed" in out else out["files"]


def _labels(fe: str, root: Path, xml: Path) -> Any:
    if fe == "cli":  # the CLI has no check mode that prints the labels: it records the GPU facts
        out = _cli_json(["labels", "--root", str(root), "--profile", str(root / PROFILE_AT.lstrip("/")),
                         "--nvidia-smi-xml", str(xml), "--json"])
    elif fe == "bootstrap":
        out = _step("labels", root, xml)
    else:  # the role passes the profile's labels section as the task's options
        section = NODE_PROFILE["labels"]
        out = _task("nodeprep_labels", {"root": str(root), "nvidia_smi_xml": str(xml),
                                        "extra": section["extra"], "cloud": section["cloud"],
                                        "mig_strategy": section["mig_strategy"], "kernel": KERNEL,
                                        "nfd_file": "", "json_file": ""})
    return out if "failed" in out else out["labels"]


def _join(fe: str, root: Path, xml: Path) -> Any:
    if fe == "cli":
        return _cut(_cli_json(["join", "--root", str(root), "--profile", str(root / PROFILE_AT.lstrip("/")),
                               "--nvidia-smi-xml", str(xml), "--skip-discovery", "--skip-preflight",
                               "--check", "--json"]))
    if fe == "bootstrap":  # doctor gated the bring-up already; no discovery in check mode
        return _cut(_step("join", root, xml))
    return _cut(_task("nodeprep_join", {"root": str(root), "profile": PROFILE_AT,
                                        "nvidia_smi_xml": str(xml), "skip_discovery": True,
                                        "skip_preflight": True}), "plan")


def _uninstall(fe: str, root: Path, xml: Path) -> Any:
    if fe == "cli":
        return _cli_json(["uninstall", "--root", str(root), "--check", "--json"])
    out = _task("nodeprep_driver", {"root": str(root), "state": "absent"})
    return out if "failed" in out else out["plan"]


# verb -> (its front-ends' plans, whether a run leaves the root as it was); bootstrap never uninstalls
VERBS = {
    "runtime": (_runtime, ("cli", "bootstrap", "ansible"), True),
    "labels": (_labels, ("cli", "bootstrap", "ansible"), False),
    "join": (_join, ("cli", "bootstrap", "ansible"), True),
    "uninstall": (_uninstall, ("cli", "ansible"), True),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_three_front_ends_plan_the_same_verb(verb: str, tmp_path: Path) -> None:
    pytest.importorskip("ansible")
    from tests.support.fixtures import NVIDIA_SMI
    from tests.unit.join.conftest import install_driver, write_token

    root = tmp_path / "root"
    root.mkdir()
    install_driver(root, tmp_path / "work")
    write_token(root)
    profile = root / PROFILE_AT.lstrip("/")
    profile.write_text(yaml.safe_dump(NODE_PROFILE))
    xml = NVIDIA_SMI / "dual-rtx-a5000_590.44.01.xml"
    plan_of, front_ends, unchanged = VERBS[verb]
    before = tree(root)
    plans = {fe: plan_of(fe, root, xml) for fe in front_ends}
    if unchanged:
        assert tree(root) == before  # check mode everywhere: nothing written
    assert all(not (isinstance(p, dict) and "failed" in p) for p in plans.values()), plans
    assert plans["cli"], plans
    for fe in front_ends:
        assert plans[fe] == plans["cli"], (fe, plans[fe], plans["cli"])


GPU_FACTS = "/opt/nvidia/gpu-facts.json"
STALE_FACTS = '{"nodeprep": "gpu-facts", "source": "pci", "gpus": []}\n'


def _record(fe: str, root: Path, xml: Path, check: bool) -> Any:
    """One labels run of the front-end `fe` on `root` (with `check`, a check-mode one): its answer."""
    profile = root / PROFILE_AT.lstrip("/")
    if fe == "cli":
        from nodeprep.cli import main

        r = separate_stderr().invoke(main, ["labels", "--root", str(root), "--profile", str(profile),
                                            "--nvidia-smi-xml", str(xml), "--check" if check else "--json"])
        return r.stdout if r.exit_code == 0 else {"failed": r.stderr.strip()}
    if fe == "bootstrap":
        from nodeprep.bootstrap import steps

        ctx = Context(root=root, profile=load_profile(profile), profile_path=profile, digest="",
                      options=Options(check=check, nvidia_smi_xml=xml))
        return steps.step_labels(ctx)
    section = NODE_PROFILE["labels"]
    return _task("nodeprep_labels", {"root": str(root), "nvidia_smi_xml": str(xml), "extra": section["extra"],
                                     "cloud": section["cloud"], "mig_strategy": section["mig_strategy"],
                                     "kernel": KERNEL, "nfd_file": "", "json_file": ""}, check=check)


def test_three_front_ends_record_the_same_gpu_facts(tmp_path: Path) -> None:
    """`nodeprep labels`, bootstrap's labels step and nodeprep_labels each make the one call
    label_node, which records the GPU facts: on a root with an active driver and stale facts, a
    check-mode run of each names the facts file and leaves the root as it was; a real run writes
    the same bytes for all three."""
    pytest.importorskip("ansible")
    from tests.support.fixtures import NVIDIA_SMI
    from tests.unit.join.conftest import install_driver

    xml = NVIDIA_SMI / "dual-rtx-a5000_590.44.01.xml"
    recorded = {}
    for fe in ("cli", "bootstrap", "ansible"):
        root = tmp_path / fe / "root"
        root.mkdir(parents=True)
        install_driver(root, tmp_path / fe / "work")
        profile = root / PROFILE_AT.lstrip("/")
        profile.parent.mkdir(parents=True)
        profile.write_text(yaml.safe_dump(NODE_PROFILE))
        facts = root / GPU_FACTS.lstrip("/")
        facts.write_text(STALE_FACTS)
        before = tree(root)
        planned = _record(fe, root, xml, check=True)
        assert not (isinstance(planned, dict) and "failed" in planned), (fe, planned)
        assert tree(root) == before, fe  # check mode: planned, nothing written
        if fe == "cli":
            assert f"would write {facts} (GPU facts)" in planned, planned
        elif fe == "bootstrap":
            assert planned["summary"].endswith(f"; would write {GPU_FACTS})"), planned
        else:
            assert planned["changed"] and planned["gpu_facts"] == str(facts), planned
        done = _record(fe, root, xml, check=False)
        assert not (isinstance(done, dict) and "failed" in done), (fe, done)
        recorded[fe] = facts.read_bytes()
        assert recorded[fe] != STALE_FACTS.encode() and (facts.stat().st_mode & 0o7777) == 0o644, fe
    assert recorded["bootstrap"] == recorded["cli"] and recorded["ansible"] == recorded["cli"], recorded
    assert json.loads(recorded["cli"])["source"] == "nvidia-smi"


# A flag and a task option are held to the field's rule as the profile file is (profile.overrides.
# section_with): each front-end refuses the same bad value, naming the same field, and writes nothing.
BAD_VALUES = {"driver.kernel": "../../etc", "driver.version": "535.x", "driver.gpus": "1234"}


@pytest.mark.parametrize("path", sorted(BAD_VALUES))
def test_a_bad_override_is_refused_by_the_fields_rule(path: str, served: str, tmp_path: Path) -> None:
    pytest.importorskip("ansible")
    from nodeprep.cli import main
    from nodeprep.profile.fields import field_by_path
    from tests.unit.fleet.test_module_sequence import module

    f, value = field_by_path(path), BAD_VALUES[path]
    good = {"store": served, "kernel": KERNEL, "version": VERSION}
    if path == "driver.gpus":
        good.pop("version")
    root = tmp_path / "image"
    root.mkdir()
    profile = tmp_path / "node.yaml"
    profile.write_text(yaml.safe_dump({"driver": {**good, f.key: value}}))
    r = separate_stderr().invoke(main, ["install", "--root", str(root), "--profile", str(profile), "--check"])
    assert r.exit_code == 2 and f"{path}: " in r.stderr, r.stderr  # the file: the rule, by field
    _, problems = f.parse(value)
    flags = [arg for k, v in good.items() if k != f.key
             for arg in (field_by_path(f"driver.{k}").flag, v)]
    r = separate_stderr().invoke(main, ["install", "--root", str(root), *flags, f.flag, value, "--check"])
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {f.flag}: {problems[0]}", r.stderr
    status, result = module("nodeprep_driver", {"root": str(root), "state": "active", **good, f.key: value},
                            check=True)
    assert status.startswith("FAILED") and result["msg"] == f"{path}: {problems[0]}", result
    assert not any(root.iterdir())  # nothing written by any of them
