"""Which driver follows the node's GPUs: version and flavour from each candidate's supported-GPU list.

Pure: `choose` takes the candidates (driver version, the flavours it comes in, its
`supported-gpus.json` text) and the GPUs' PCI ids, and picks the oldest or newest version whose
list names and supports every GPU (a GPU a list does not name counts against that candidate
here, though install only notes it: NVIDIA's lists are incomplete), with the flavour the GPUs need:

- open where a GPU needs it (NVIDIA supports Grace Hopper and Blackwell with the open kernel
  modules only: `support.needs_open`),
- proprietary where a GPU's entry has no `kernelopen` (before Turing),
- otherwise the preferred flavour (the caller's; proprietary unless told).

None supporting them all is an InputError naming the GPUs, every version tried and why the first
of them failed (the others' reasons in its hint). The rules per GPU and list are
nodeprep.node.support's (`check_support`).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact import read_member
from ..errors import InputError
from ..pci import devices_dir
from ..profile.fields import field_error
from ..urls import redact_url
from ..vocab import BRANCH_POLICIES, DRIVER_BRANCH_RE, driver_branch, version_key
from . import support
from .kmod import target_kernel
from .layout import Layout

POLICIES = BRANCH_POLICIES
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    version: str  # exact driver version
    flavours: tuple[str, ...]  # the flavours it can be had in (built, or in the store)
    supported: str  # its supported-gpus.json


@dataclass(frozen=True)
class Choice:
    version: str
    flavour: str
    tried: tuple[str, ...]  # the versions looked at, in the order of the policy


def flavour_for(candidate: Candidate, gpus: Sequence[str], preferred: str = "proprietary") -> tuple[
        str | None, list[str]]:
    """(the flavour of `candidate` that runs every GPU, or None; the problems that ruled the others out)."""
    if any(support.needs_open(gpu) for gpu in gpus):
        order = ["open"]
    else:
        order = [preferred, *(f for f in ("proprietary", "open") if f != preferred)]
    problems: list[str] = []
    missing: list[str] = []  # after the GPUs' problems: those say more
    for flavour in order:
        if flavour not in candidate.flavours:
            missing.append(f"{candidate.version} has no {flavour} flavour here")
            continue
        unlisted: list[str] = []
        found = support.check_support(candidate.supported, flavour, list(gpus),
                                      driver_version=candidate.version, notes=unlisted)
        if not found and not unlisted:
            return flavour, problems
        problems += found + [n.replace("(NVIDIA's list is incomplete; not refused)",
                                       "(chosen only where listed)") for n in unlisted]
    return None, problems + missing


def choose(candidates: Iterable[Candidate], gpus: Sequence[str], *, policy: str = "newest",
           preferred: str = "proprietary", what: str = "--gpus", presorted: bool = False,
           branch: str | None = None, field: str | None = None) -> Choice:
    """The candidate (by `policy`) supporting every GPU in `gpus`, and its flavour; InputError naming
    the GPUs and the versions tried (and `branch`, the candidates' branch, when given) when none does,
    as `what` (its flag) or `field` (the profile's field). `presorted`: `candidates` come in the
    policy's order already and are taken one at a time (a store's lists are read only as far as needed)."""
    if policy not in POLICIES:
        raise InputError(f"{what}: policy {policy!r} is not one of {', '.join(POLICIES)}")
    for gpu in gpus:
        support.PciId.parse(gpu)  # a bad id is refused before anything is chosen
    ordered = candidates if presorted else sorted(
        candidates, key=lambda c: version_key(c.version), reverse=policy == "newest")
    tried: list[str] = []
    reasons: list[str] = []
    for cand in ordered:
        tried.append(cand.version)
        flavour, problems = flavour_for(cand, gpus, preferred)
        if flavour is not None:
            return Choice(cand.version, flavour, tuple(dict.fromkeys(tried)))
        reasons.append(problems[0] if problems else f"{cand.version}: no flavour")
    if not tried:
        raise InputError("no driver version to choose from", flag=what, field=field)
    tried = list(dict.fromkeys(tried))
    shown = ", ".join(gpus)
    of = f" of branch {branch}" if branch else ""
    raise InputError(
        f"no driver version{of} supports every GPU of the node ({shown}); tried {', '.join(tried)} "
        f"({policy} first): {reasons[0]}",
        hint="\n".join(dict.fromkeys(reasons[1:])) or None, flag=what, field=field,
    )


# -- the edges: which GPUs, which candidates ----------------------------------------------------


def gpu_ids(root: Path, value: str, *, what: str = "--gpus", field: str | None = None,
            sys_dir: Path | None = None) -> list[str]:
    """The PCI ids `value` names: 'node' (the NVIDIA GPUs under SYS/bus/pci/devices: `sys_dir`, default
    ROOT/sys) or a comma list of '10de:DEVICE[:SUBVENDOR:SUBDEVICE]'; InputError as `what` (a flag) or
    `field`."""
    if value == "node":
        ids = support.node_pci_ids(root, sys_dir)
        if not ids:
            where = devices_dir(sys_dir if sys_dir is not None else Path(root) / "sys")
            raise InputError(f"no NVIDIA GPU under {where}", flag=what, field=field)
        return ids
    ids = [v.strip() for v in value.split(",") if v.strip()]
    if not ids:
        raise InputError(f"{value!r} names no GPU ('node' or 10de:DEVICE,...)", flag=what, field=field)
    for gpu in ids:
        try:
            support.PciId.parse(gpu)
        except InputError as e:
            raise InputError(str(e), flag=what, field=field) from None
    return ids


def store_candidates(store: Any, kernel: str | None, arch: str, download_dir: Path, *,
                     policy: str = "newest", branch: str | None = None) -> Iterator[Candidate]:
    """The store's driver versions (of `branch` when given) in the order of `policy` that have a
    user-space artifact for `arch` carrying a supported-GPU list and kmod artifacts (their flavours)
    for `kernel` (None: any); each user space is read (a remote one downloaded into `download_dir`)
    only when the candidate is reached."""
    entries = store.entries()
    spaces = sorted((e for e in entries if e.kind == "userspace" and e.arch == arch
                     and branch in (None, driver_branch(e.driver_version))),
                    key=lambda e: version_key(e.driver_version), reverse=policy == "newest")
    for us in spaces:
        flavours = tuple(sorted({str(e.flavour) for e in entries if e.kind == "kmod" and e.flavour
                                 and e.driver_version == us.driver_version
                                 and kernel in (None, e.kernel_release)}))
        if not flavours:
            continue
        data = read_member(store.fetch(us, download_dir), support.SUPPORT_FILE)
        if data is not None:
            yield Candidate(us.driver_version, flavours, data.decode("utf-8", "replace"))


def choose_from_store(store: Any, gpus: Sequence[str], kernel: str | None, *, arch: str = "amd64",
                      policy: str = "newest", preferred: str = "proprietary", branch: str | None = None,
                      what: str = "--gpus", field: str | None = None) -> Choice:
    """`choose` over the store's candidates for `kernel` (of `branch` when given), read as far as
    needed; a remote store's user spaces go to a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="nodeprep-branch-") as tmp:
        return choose(store_candidates(store, kernel, arch, Path(tmp), policy=policy, branch=branch), gpus,
                      policy=policy, preferred=preferred, presorted=True, branch=branch, what=what,
                      field=field)


def require_pinned(store: Any, version: str, flavour: str, gpus: Sequence[str], *, arch: str = "amd64",
                   what: str = "driver.version") -> bool:
    """Refuse (InputError naming `what`) a pinned `version` and `flavour` that does not run a GPU in
    `gpus` by the version's list in the store, as install would (nodeprep.node.support's rules: a GPU
    the list does not name is not refused); False when its user space carries no list (not checked)."""
    entry = next((e for e in store.entries() if e.kind == "userspace" and e.driver_version == version
                  and e.arch == arch), None)
    if entry is None:
        raise InputError(f"{what}: {version} has no user-space artifact ({arch}) in the store")
    with tempfile.TemporaryDirectory(prefix="nodeprep-branch-") as tmp:
        data = read_member(store.fetch(entry, Path(tmp)), support.SUPPORT_FILE)
    if data is None:
        return False
    problems = support.check_support(data.decode("utf-8", "replace"), flavour, list(gpus),
                                     driver_version=version)
    if problems:
        raise InputError(f"{what}: {problems[0]}", hint="\n".join(problems[1:]) or None)
    return True


def branch_versions(store: Any, branch: str, kernel: str | None, *, arch: str = "amd64",
                    flavour: str | None = None) -> list[str]:
    """The versions of `branch` in the store with a user space for `arch` and kernel modules (of
    `flavour` when given) for `kernel` (None: any kernel), oldest first."""
    entries = store.entries()
    spaces = {e.driver_version for e in entries if e.kind == "userspace" and e.arch == arch
              and driver_branch(e.driver_version) == branch}
    kmods = {e.driver_version for e in entries if e.kind == "kmod" and kernel in (None, e.kernel_release)
             and flavour in (None, e.flavour)}
    return sorted(spaces & kmods, key=version_key)


def pick(store: Any, root: Path, *, version: str | None, branch: str | None, gpus: str | None,
         kernel: str | None, flavour: str | None, policy: str = "newest", arch: str = "amd64",
         sys_dir: Path | None = None) -> tuple[str, str | None]:
    """(version, flavour) the driver settings name (the profile's driver section, install's flags, the
    role's variables: one vocabulary): `version` itself, refused when not of `branch`, checked against
    the GPUs `gpus` names when given (`require_pinned`); else the `policy`'s version of `branch` in the
    store, running those GPUs when given (`choose_from_store`). `gpus` 'node': the GPUs under
    `sys_dir` (default ROOT/sys). `kernel`: the one whose modules count (None: the running kernel).
    InputErrors name the field (the CLI its flag)."""
    if branch is not None and not DRIVER_BRANCH_RE.fullmatch(branch):
        raise field_error("driver.branch", f"{branch!r} is not a driver branch (its major number, e.g. 580)")
    if version is not None and branch is not None and driver_branch(version) != branch:
        raise field_error("driver.branch", f"{branch} contradicts driver.version {version} (of branch "
                                           f"{driver_branch(version)})")
    ids = gpu_ids(root, gpus, field="driver.gpus", sys_dir=sys_dir) if gpus else []
    if version is not None:
        if ids:
            flavour = flavour or "proprietary"
            require_pinned(store, version, flavour, ids, arch=arch)
            log.info("%s: driver.version %s (%s) runs them", ",".join(ids), version, flavour)
        return version, flavour
    if branch is None and not ids:
        raise field_error("driver.version", "missing (give it, or driver.branch or driver.gpus to choose it)")
    target = target_kernel(Layout(root), kernel)
    if branch is not None:
        have = branch_versions(store, branch, target, arch=arch, flavour=None if ids else flavour)
        if not have:
            where = redact_url(store.location)
            raise field_error("driver.branch", f"{branch} has no version in the store {where} (a user space "
                                               f"for {arch} and kernel modules for {target})")
        if not ids:
            chosen = have[-1] if policy == "newest" else have[0]
            log.info("driver.branch %s: %s, the %s of %s", branch, chosen, policy, ", ".join(have))
            return chosen, flavour
    what, field = ("--branch", "driver.branch") if branch else ("--gpus", "driver.gpus")
    choice = choose_from_store(store, ids, target, arch=arch, policy=policy,
                               preferred=flavour or "proprietary", branch=branch, what=what, field=field)
    log.info("%s: %s (%s), the %s of %s", ",".join(ids), choice.version, choice.flavour, policy,
             ", ".join(choice.tried))
    return choice.version, choice.flavour
