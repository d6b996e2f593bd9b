"""`nodeprep upgrade …`: the steps of a driver rollout that playbooks/upgrade-driver.yml calls.

Cluster side (where the kubeconfig is, the Ansible controller): `plan`, `admit` (a batch re-planned
before it starts), `prepare`, `finish`, `fail`, `budget`. Node side: `reload` (reload the modules in
place or say reboot) and `revert` (roll a failed version back). Thin: options, one call into
nodeprep.upgrade, rendering (docs/fleet.md, "Upgrades")."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click

from ..errors import InputError, NodeprepError
from ..kubeapi import load_kubeconfig
from ..node import oplog
from ..upgrade import policy, rollout
from ..upgrade.cluster import connect
from ..upgrade.nodeside import replace, revert
from ..upgrade.rollout import Options
from ..upgrade.states import FAILED, NodeView, resume_point
from .clioptions import (
    check_json_options,
    emit_json,
    json_option,
    no_load_option,
    path_option,
    root_option,
    stacked,
)
from .install import _driver

kubeconfig_option = click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Credentials allowed to read and patch nodes, list pods and create pods/eviction.",
)
node_option = click.option("--node", required=True, help="The Node's name in the cluster.")
version_option = click.option(
    "--version",
    "target",
    required=True,
    metavar="VERSION",
    help="The driver version the rollout installs (its state refers to it).",
)
node_step_options = stacked(kubeconfig_option, node_option, version_option)
"""--kubeconfig, --node, --version: a cluster-side step of one node."""
failure_budget_option = click.option("--failure-budget", type=click.IntRange(1), default=1, show_default=True)


def _cluster_read_option(help: str) -> Callable[[Any], Any]:
    """--kubeconfig, optional: without it the command works from its options alone."""
    return path_option("--kubeconfig", help=help)


def _names_option(flag: str, dest: str, help: str, required: bool = False) -> Callable[[Any], Any]:
    """A repeatable NAME[,NAME…] option (read with _names or _nodes)."""
    return click.option(flag, dest, multiple=True, required=required, metavar="NAME[,NAME…]", help=help)


def _max_unavailable_option(help: str) -> Callable[[Any], Any]:
    return click.option("--max-unavailable", default="25%", show_default=True, help=help)


def _seconds_option(flag: str, default: float, help: str) -> Callable[[Any], Any]:
    """Seconds to wait, 0 to a day."""
    return click.option(flag, type=click.FloatRange(0, 86400), default=default, show_default=True, help=help)


def _names(values: tuple[str, ...]) -> list[str]:
    """The node names of repeatable NAME[,NAME…] options, in order."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def _nodes(values: tuple[str, ...]) -> list[str]:
    names = _names(values)
    if not names:
        raise InputError("at least one node name is needed", flag="--node")
    if len(set(names)) != len(names):
        raise InputError("a node is named twice", flag="--node")
    return names


def _cluster(kubeconfig: Path) -> Any:
    return connect(load_kubeconfig(kubeconfig))


def _emit(result: dict[str, Any], lines: list[str], as_json: bool) -> None:
    if as_json:
        emit_json(result)
    else:
        for line in lines:
            click.echo(line)


def _emit_step(node: str, res: Any, lines: list[str], as_json: bool) -> None:
    """A node step's result: its lines, then the state it left the node in, each naming the node."""
    _emit(res.to_dict(), [f"node {node}: {line}" for line in [*lines, res.state]], as_json)


def _options(**kw: Any) -> Any:
    return Options(**{k: v for k, v in kw.items() if v is not None})


@click.group("upgrade")
def upgrade_group() -> None:
    """Driver rollouts across a fleet: a per-node state label (nodeprep.dev/upgrade-state), only GPU
    pods evicted, batches and budgets (docs/fleet.md, "Upgrades")."""


@upgrade_group.command("plan")
@_cluster_read_option(
    "Read each node's state from the cluster (without: every node is to do, none unschedulable)."
)
@_names_option("--node", "nodes", "The nodes of the rollout, in inventory order (repeatable).", required=True)
@version_option
@click.option(
    "--batch", default="1", show_default=True, help="Nodes per batch: a count or a percentage (5%)."
)
@_max_unavailable_option(
    "Unschedulable nodes at most across these nodes (a count or a percentage); nodes already "
    "unschedulable count."
)
@click.option(
    "--failure-budget",
    type=int,
    default=1,
    show_default=True,
    help="The rollout pauses once this many nodes failed.",
)
@click.option("--mark", is_flag=True, help="Label the planned nodes upgrade-required.")
@check_json_options("With --mark: say which nodes would be labelled, label none.")
def plan_cmd(
    kubeconfig: Path | None,
    nodes: tuple[str, ...],
    target: str,
    batch: str,
    max_unavailable: str,
    failure_budget: int,
    mark: bool,
    check: bool,
    as_json: bool,
) -> None:
    """The batches of a rollout and their order; exit 1 when the failure budget is spent already."""
    names = _nodes(nodes)
    if mark and kubeconfig is None:
        raise InputError("--mark needs --kubeconfig FILE")
    marked: list[str] = []
    with _cluster(kubeconfig) if kubeconfig is not None else nullcontext() as c:
        views = (rollout.status(c, names) if c is not None
                 else [NodeView(n, None, None, None, False, False) for n in names])
        p = policy.plan(views, target, batch=batch, max_unavailable=max_unavailable,
                        failure_budget=failure_budget)
        if mark and c is not None and not p.paused:  # --mark needs --kubeconfig (above)
            marked = rollout.mark_required(c, views, [n for b in p.batches for n in b], target, check=check)
    result = {**p.to_dict(), "marked": marked, "nodes": [v.to_dict() for v in views]}
    lines = p.render() + (
        [f"{'would label' if check else 'labelled'} upgrade-required: {', '.join(marked)}"] if marked else []
    )
    _emit(result, lines, as_json)
    if p.paused:
        raise NodeprepError(policy.budget_spent(p.failed, failure_budget) or "rollout paused")


@upgrade_group.command("admit")
@kubeconfig_option
@_names_option("--node", "nodes", "All the rollout's nodes, in inventory order (repeatable).", required=True)
@_names_option("--batch-nodes", "batch_nodes", "The nodes of the batch about to start (repeatable).",
               required=True)
@version_option
@_max_unavailable_option("Unschedulable nodes at most across the rollout's nodes (a count or a percentage).")
@failure_budget_option
@json_option
def admit_cmd(
    kubeconfig: Path,
    nodes: tuple[str, ...],
    batch_nodes: tuple[str, ...],
    target: str,
    max_unavailable: str,
    failure_budget: int,
    as_json: bool,
) -> None:
    """Re-plan a batch before it starts, from the cluster's state now: which of its nodes may start
    (nodes that became unschedulable meanwhile count against --max-unavailable, failed nodes against
    the failure budget); exit 1 when the failure budget is spent (the rollout pauses). Reads only."""
    names = _nodes(nodes)
    batch = _nodes(batch_nodes)
    with _cluster(kubeconfig) as c:
        a = policy.admit(
            rollout.status(c, names),
            batch,
            target,
            max_unavailable=max_unavailable,
            failure_budget=failure_budget,
        )
    _emit(a.to_dict(), a.render(), as_json)
    if a.paused:
        raise NodeprepError(policy.budget_spent(a.failed, failure_budget) or "rollout paused")


@upgrade_group.command("prepare")
@node_step_options
@_seconds_option(
    "--timeout", 600.0,
    "Seconds an eviction may be refused by a PodDisruptionBudget, and evicted pods may take to go.",
)
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 600),
    default=5.0,
    show_default=True,
    help="Seconds between refused evictions.",
)
@click.option(
    "--full-drain", is_flag=True, help="Evict every pod (not DaemonSets, mirror pods), not only GPU pods."
)
@click.option("--opt-out-label", default=None, metavar="KEY",
              help="Pods with KEY=true are never evicted [default: nodeprep.dev/upgrade-skip-eviction].")
@click.option("--wait-for-jobs", default=None, metavar="SELECTOR",
              help="Before evicting, wait for the node's pods matching this label selector to finish.")
@_seconds_option("--jobs-timeout", 0.0, "Seconds to wait for them (then go on).")
@click.option(
    "--grace-period",
    type=click.IntRange(0, 86400),
    default=None,
    help="Seconds evicted pods get to stop (default: each pod's own).",
)
@check_json_options("Print the steps and the pods that would be evicted; change nothing.")
def prepare_cmd(
    kubeconfig: Path, node: str, target: str, timeout: float, interval: float, full_drain: bool,
    opt_out_label: str | None, wait_for_jobs: str | None, jobs_timeout: float, grace_period: int | None,
    check: bool, as_json: bool,
) -> None:
    """From the node's state on: cordon (recorded as the rollout's), wait for jobs, evict the GPU pods
    (Eviction API, disruption budgets honoured), drain; up to pod-restart-required."""
    opts = _options(timeout=timeout, interval=interval, full_drain=full_drain, opt_out_label=opt_out_label,
                    wait_for_jobs=wait_for_jobs, jobs_timeout=jobs_timeout, grace_seconds=grace_period)
    with _cluster(kubeconfig) as c:
        res = rollout.prepare(c, node, target, opts, check=check)
    _emit_step(node, res, res.lines + [f"kept {k}" for k in res.kept], as_json)


@upgrade_group.command("finish")
@node_step_options
@_seconds_option(
    "--validation-timeout", 600.0,
    "Seconds the GPU self-test verdict may take to lift the nodeprep.dev/unverified taint.",
)
@click.option(
    "--no-selftest",
    is_flag=True,
    help="Do not wait for the GPU self-test verdict (nodes without verify-gpus; the doctor gate only).",
)
@check_json_options("Print the steps; change nothing.")
def finish_cmd(
    kubeconfig: Path, node: str, target: str, validation_timeout: float, no_selftest: bool, check: bool,
    as_json: bool,
) -> None:
    """After the node's driver changed: validation, uncordon (only a node the rollout cordoned),
    upgrade-done. Exit 1 when validation fails (the node stays cordoned)."""
    opts = _options(validation_timeout=validation_timeout, require_selftest=not no_selftest)
    with _cluster(kubeconfig) as c:
        res = rollout.finish(c, node, target, opts, check=check)
    _emit_step(node, res, list(res.lines), as_json)


@upgrade_group.command("fail")
@node_step_options
@click.option("--reason", required=True, help="Why (kept in the nodeprep.dev/upgrade-reason annotation).")
@check_json_options("Print the state it would set; change nothing.")
def fail_cmd(kubeconfig: Path, node: str, target: str, reason: str, check: bool, as_json: bool) -> None:
    """Mark the node upgrade-failed with the reason; it stays cordoned."""
    with _cluster(kubeconfig) as c:
        res = rollout.fail(c, node, target, reason, check=check)
    _emit_step(node, res, list(res.lines), as_json)


@upgrade_group.command("budget")
@_cluster_read_option("Count the nodes labelled upgrade-failed for VERSION in the cluster too.")
@_names_option("--node", "nodes", "The rollout's nodes (repeatable).")
@_names_option("--failed", "failed_now", "Nodes that failed in this run (repeatable).")
@version_option
@failure_budget_option
@json_option
def budget_cmd(
    kubeconfig: Path | None,
    nodes: tuple[str, ...],
    failed_now: tuple[str, ...],
    target: str,
    failure_budget: int,
    as_json: bool,
) -> None:
    """Exit 1 with the failed nodes listed once they reach the failure budget (the rollout pauses)."""
    failed = set(_names(failed_now))
    if kubeconfig is not None and nodes:
        with _cluster(kubeconfig) as c:
            failed |= {v.name for v in rollout.status(c, _nodes(nodes)) if resume_point(v, target) == FAILED}
    message = policy.budget_spent(sorted(failed), failure_budget)
    _emit(
        {"failed": sorted(failed), "failure_budget": failure_budget, "paused": message is not None},
        [] if message else [f"{len(failed)} failed node(s), failure budget {failure_budget}"],
        as_json,
    )
    if message:
        raise NodeprepError(message)


@upgrade_group.command("reload")
@root_option
@path_option("--sysfs-root", directory=True,
             help="Stands for /sys (SYSFS/module/*/refcnt, holders) [default: ROOT/sys].")
@version_option
@click.option(
    "--modules",
    default=None,
    metavar="LIST",
    help="Modules to load after the unload [default: driver.modules of the profile].",
)
@check_json_options("Print the decision (reload, reboot, load, none) and its reasons; change nothing.")
def reload_cmd(
    root: Path, sysfs_root: Path | None, target: str, modules: str | None, check: bool, as_json: bool
) -> None:
    """Replace the loaded nvidia modules with VERSION's in place when nothing holds them (reference
    counts, holders, processes with /dev/nvidia* open); otherwise report that a reboot is needed."""
    mods = _driver(root, None, {"driver.modules": modules}).modules
    res = replace(root, target, sysfs_root=sysfs_root, modules=mods, check=check)
    lines = [f"{res.decision.action}: {r}" for r in res.decision.reasons] + list(res.done)
    if not check and not res.done and res.decision.action in ("reload", "load"):
        lines.append(f"--root {root}: modules are not loaded for an image (the unit loads them at boot)")
    _emit(res.to_dict(), lines, as_json)


@upgrade_group.command("revert")
@root_option
@version_option
@no_load_option
@check_json_options("Print whether VERSION would be rolled back; change nothing.")
def revert_cmd(root: Path, target: str, no_load: bool, check: bool, as_json: bool) -> None:
    """Roll a failed upgrade back: `nodeprep rollback` when VERSION is the active driver (nothing when
    the upgrade never switched)."""
    mods = _driver(root, None, {}).modules
    res = revert(root, target, load=not no_load, modules=mods, check=check)
    if res.changed and not check:
        oplog.record(root, "upgrade revert", [f"activated {res.active} (previous: {target})"])
    _emit(res.to_dict(), list(res.notes[:1]), as_json)


COMMANDS: list[click.Command] = [upgrade_group]
