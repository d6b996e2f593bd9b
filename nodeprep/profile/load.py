"""Reading a profile: the YAML file (nodeprep.yamlinput's bounded, strict reader), then every field
through the table (fields.py), collecting every problem as `field.path: message` (with its line)
into one ProfileError (exit 2); unknown keys get a did-you-mean."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import kubeletflags
from ..errors import ProfileError
from ..vocab import DRIVER_BRANCH_RE, DRIVER_VERSION_RE, driver_branch
from ..yamlinput import Document, load_yaml
from . import checks
from .fields import FIELDS, REQUIRED_SECTIONS
from .model import GPU_TAINT, K8S_VERSION_RE, SECTIONS, Cluster, Profile, Taint
from .rules import name_of, type_name

DEFAULT_PATH = Path("/etc/nodeprep/node.yaml")
MAX_PROBLEMS = 20  # listed in one error line; the rest are counted


def _did_you_mean(key: str, options: list[str]) -> str:
    match = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else f" (allowed: {', '.join(options)})"


# kubeadm mode without CA pins: refused unless `join --insecure-skip-ca-verification` (also in
# nodeprep.join.joinplan for profiles built by hand)
CA_PIN_REQUIRED = ("cluster.ca_cert_hashes: required in mode kubeadm to verify the cluster CA (kubeadm token "
                   "create --print-join-command shows the sha256:... pin; cloud-init --ca-cert-hash adds it)")


def _check_invariants(sections: Mapping[str, Mapping[str, Any]], insecure_skip_ca_verification: bool
                      ) -> list[str]:
    """Rules across fields that the table cannot express."""
    problems: list[str] = []
    cluster = sections.get("cluster")
    if cluster:
        if (cluster.get("mode", "kubeadm") == "kubeadm" and not cluster.get("ca_cert_hashes")
                and not insecure_skip_ca_verification):
            problems.append(f"{CA_PIN_REQUIRED}, or `nodeprep join --insecure-skip-ca-verification` "
                            "trusts the network")
        version = cluster.get("kubernetes_version", Cluster.kubernetes_version)
        args, gates = cluster.get("kubelet_extra_args", {}), cluster.get("feature_gates", {})
        if (isinstance(version, str) and K8S_VERSION_RE.fullmatch(version) and isinstance(args, dict)
                and isinstance(gates, dict)):
            minor = Cluster(api_server="", kubernetes_version=version).minor
            problems += kubeletflags.version_problems(
                {k: v for k, v in args.items() if isinstance(k, str) and isinstance(v, str)}, minor,
                {k: v for k, v in gates.items() if isinstance(k, str)})
        if cluster.get("gpu_taint") and any(
            isinstance(t, Taint) and t.key == GPU_TAINT.key and t.value != GPU_TAINT.value
            for t in cluster.get("taints", ())
        ):
            problems.append(
                "cluster.taints: conflicts with gpu_taint (nvidia.com/gpu taint with another value)"
            )
    driver = sections.get("driver")
    if driver is not None:
        problems += _driver_choice(driver)
    if driver:
        problem = checks.store_transport(driver.get("store"), driver.get("insecure_http", False))
        if problem:
            problems.append(f"driver.store: {problem}")
    problems += _mig_choice(sections.get("mig"))
    runtime = sections.get("runtime")
    if runtime and runtime.get("default_runtime") and not runtime.get("nvidia_runtime", True):
        problems.append("runtime.default_runtime: needs nvidia_runtime: true")
    return problems


def _mig_choice(mig: Mapping[str, Any] | None) -> list[str]:
    """mig.select names one of mig.config's mig-configs; without it mig.config has exactly one."""
    if not mig:
        return []
    config, select = mig.get("config"), mig.get("select")
    configs = config.get("mig-configs") if isinstance(config, dict) else None
    if not isinstance(configs, dict):
        return ["mig.select: needs mig.config"] if select is not None and config is None else []
    names = [n for n in configs if isinstance(n, str)]
    if select is None and len(names) > 1:
        return [f"mig.select: required when mig.config has several mig-configs ({', '.join(names[:8])})"]
    if isinstance(select, str) and select not in configs:
        return [f"mig.select: {select!r} is not one of mig.config's mig-configs"
                f"{_did_you_mean(select, names)}"]
    return []


def _driver_choice(driver: Mapping[str, Any]) -> list[str]:
    """driver.version, or driver.branch / driver.gpus to choose it; a version and a branch agree."""
    version, branch = driver.get("version"), driver.get("branch")
    if version is None and branch is None and driver.get("gpus") is None:
        return ["driver.version: required (or driver.branch or driver.gpus to choose it from the store)"]
    if (isinstance(version, str) and isinstance(branch, str) and DRIVER_VERSION_RE.fullmatch(version)
            and DRIVER_BRANCH_RE.fullmatch(branch) and driver_branch(version) != branch):
        return [f"driver.branch: {branch} contradicts driver.version {version} (of branch "
                f"{driver_branch(version)}): give the version alone, or a version of the branch"]
    return []


def parse_profile(data: Any, source: str = "profile", document: Document | None = None, *,
                  insecure_skip_ca_verification: bool = False) -> Profile:
    """Build a Profile from parsed YAML/JSON data; raise ProfileError listing every problem (with
    its line when `document` is the parsed file). A kubeadm cluster without CA pins is refused
    unless the caller joins with `insecure_skip_ca_verification` (`join`'s flag of that name)."""
    problems: list[str] = []

    def at(*path: Any) -> str:
        line = document.line(*path) if document is not None else None
        return f" (line {line})" if line else ""

    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError([f"top level must be a mapping, got {type_name(data)}"], source=source)
    for key in data:
        if key not in SECTIONS:
            problems.append(
                f"{name_of(key)}: unknown section{_did_you_mean(str(key)[:80], list(SECTIONS))}{at(key)}"
            )
    parsed: dict[str, dict[str, Any]] = {}
    for name in SECTIONS:
        raw = data.get(name)
        if raw is None:
            if name in REQUIRED_SECTIONS:
                problems.append(f"{name}: required section is missing")
            continue
        if not isinstance(raw, dict):
            problems.append(f"{name}: expected a mapping, got {type_name(raw)}{at(name)}")
            continue
        table = [f for f in FIELDS if f.section == name]
        known = [f.key for f in table]
        for key in raw:
            if key not in known:
                problems.append(
                    f"{name}.{name_of(key)}: unknown key{_did_you_mean(str(key)[:80], known)}{at(name, key)}"
                )
        values: dict[str, Any] = {}
        for f in table:
            if f.key not in raw:
                if f.required:
                    problems.append(f"{f.path}: required")
                continue
            value, errs = f.parse(raw[f.key])
            for e in errs[: MAX_PROBLEMS + 1]:
                where = at(name, f.key, *getattr(e, "at", ()))
                problems.append(f"{f.path}: {e}{where}" if not e.startswith("[") else f"{f.path}{e}{where}")
            if len(errs) > MAX_PROBLEMS + 1:
                problems.append(f"{f.path}: {len(errs) - MAX_PROBLEMS - 1} more problems")
            values[f.key] = value
        parsed[name] = values
    problems += _check_invariants(parsed, insecure_skip_ca_verification)
    if problems:
        if len(problems) > MAX_PROBLEMS:
            problems = [*problems[:MAX_PROBLEMS], f"and {len(problems) - MAX_PROBLEMS} more problems"]
        raise ProfileError(
            problems, source=source, hint="see examples/node.yaml and docs/profile.md for every field"
        )
    built = {name: SECTIONS[name](**values) for name, values in parsed.items()}
    return Profile(source=source, **built)


def read_profile(path: Path) -> tuple[str, Document]:
    """The profile file's text and parsed YAML (size, encoding, nesting, duplicate keys checked:
    nodeprep.yamlinput); ProfileError naming the file otherwise."""
    try:
        return load_yaml(Path(path), error=ProfileError)
    except ProfileError as e:
        if e.problems == ["file not found"]:
            e.hint = f"write one (see examples/node.yaml) or pass --profile; default {DEFAULT_PATH}"
        raise


def load_profile(path: Path, *, insecure_skip_ca_verification: bool = False) -> Profile:
    """Read and validate the profile at `path` (ProfileError naming the file on any problem)."""
    _, document = read_profile(path)
    return parse_profile(document.data, str(path), document,
                         insecure_skip_ca_verification=insecure_skip_ca_verification)


def profile_path(root: Path, profile: Path | None) -> Path:
    """The profile to use: --profile when given, else DEFAULT_PATH under --root, the image's links
    resolved beneath it (nodeprep.rootpath.beneath)."""
    if profile is not None:
        return profile
    # lazy: Ansible nodeprep_profile
    from ..rootpath import beneath

    return beneath(Path(root), DEFAULT_PATH)
