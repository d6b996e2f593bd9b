"""The node's own steps of an upgrade, for the CLI and the Ansible module alike: `replace` (reload the
modules in place when nothing holds them, else say reboot), `selftest` (the GPU self-test, its verdict
published) and `revert` (roll a failed version back)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..join.activation import CALLBACKS
from ..node import switch
from ..node.devices import load_modules
from ..node.state import load_state
from ..sysfs import read_attr
from . import reload as rl
from .states import DRIVER_LABEL


@dataclass(frozen=True)
class Replaced:
    decision: rl.Decision
    survey: rl.Survey
    done: tuple[str, ...] = ()
    check: bool = False

    @property
    def changed(self) -> bool:
        return self.decision.action in (rl.RELOAD, rl.LOAD) and (self.check or bool(self.done))

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.decision.to_dict(),
            "changed": self.changed,
            "check": self.check,
            "done": list(self.done),
            "survey": self.survey.to_dict(),
        }


def replace(
    root: Path, target: str, *, sysfs_root: Path | None = None, modules: tuple[str, ...], check: bool = False
) -> Replaced:
    """Decide reload, load, none or reboot for `target`; unless `check`, reload or load on a live root
    (an image's unit loads them at boot)."""
    facts = rl.survey(sysfs_root or root / "sys", root / "proc")
    decision = rl.decide(facts, target)
    done: list[str] = []
    if not check and decision.action in (rl.RELOAD, rl.LOAD):
        if root.resolve() != Path("/"):
            return Replaced(decision, facts, (), check)
        if decision.action == rl.RELOAD:
            done = rl.reload(facts, modules, load_modules)
        else:
            made = load_modules(modules)
            done = [f"loaded {', '.join(modules)}; created {', '.join(made) or 'no new device nodes'}"]
    return Replaced(decision, facts, tuple(done), check)


@dataclass(frozen=True)
class Reverted:
    target: str
    active: str | None
    changed: bool
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "active": self.active,
            "changed": self.changed,
            "reverted": self.changed,
            "notes": list(self.notes),
        }


def revert(root: Path, target: str, *, load: bool, modules: tuple[str, ...], check: bool = False) -> Reverted:
    """`nodeprep rollback` when `target` is the active version; nothing otherwise (the upgrade never
    switched: install verifies before it does)."""
    state = load_state(root)
    if state.active != target:
        return Reverted(
            target,
            state.active,
            False,
            (f"unchanged: {target} is not active (active: {state.active or 'none'})",),
        )
    if check:
        return Reverted(
            target, state.previous, True, (f"would roll {target} back to {state.previous or 'none'}",)
        )
    result = switch.rollback(root, load=load, modules=modules, callbacks=CALLBACKS)
    return Reverted(
        target, result.version, True, (f"rolled {target} back: active {result.version}", *result.notes)
    )


@dataclass(frozen=True)
class SelfTested:
    node: str
    label: str
    passed: bool
    problems: tuple[str, ...]
    check: bool = False
    published: bool = True  # False: no cluster, the verdict was not published

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "label": self.label,
            "passed": self.passed,
            "problems": list(self.problems),
            "changed": self.published and not self.check,
            "check": self.check,
            "published": self.published,
        }


def selftest(
    root: Path,
    *,
    kubeconfig: Path | None,
    node: str,
    sysfs_root: Path | None = None,
    persistence_mode: str = "any",
    nvidia_smi_xml: Path | None = None,
    label_timeout: float = 0.0,
    check: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> SelfTested:
    """What `nodeprep verify-gpus --apply` does: the GPU self-test, its verdict published on the Node
    with the node's own credential (`check`: the verdict it would publish, nothing patched). Without a
    `kubeconfig` (a rollout without a cluster) the self-test only: nothing is published.

    A verdict only passes when the Node's driver-version label is the tested driver; that label comes
    from the labels file node_labels wrote, through NFD, a while later: up to `label_timeout` seconds
    are waited for it before the verdict is published."""
    # lazy: Ansible nodeprep_upgrade
    from ..node.selftest import evaluate, gather

    verdict = evaluate(
        gather(
            root, sysfs_root or root / "sys", persistence_mode=persistence_mode, nvidia_smi_xml=nvidia_smi_xml
        )
    )
    if kubeconfig is None:
        return SelfTested(node, "", verdict.passed, verdict.problems, check, published=False)
    # lazy: Ansible nodeprep_upgrade
    from ..join.verification import publish_verdict, verdict_patch
    from ..kubeapi import load_kubeconfig, read_node

    boot = (read_attr(root / "proc/sys/kernel/random/boot_id") or "").strip() or None
    cfg = load_kubeconfig(kubeconfig)
    deadline = time.monotonic() + label_timeout
    while not check and verdict.passed and time.monotonic() < deadline:
        labels = (read_node(cfg, node).get("metadata") or {}).get("labels") or {}
        if labels.get(DRIVER_LABEL) == verdict.driver_version:
            break
        sleep(2.0)
    if check:
        _, pub = verdict_patch(read_node(cfg, node), verdict, boot)
    else:
        pub = publish_verdict(cfg, node, verdict, boot)
    return SelfTested(pub.node, pub.value, pub.passed, pub.problems, check)
