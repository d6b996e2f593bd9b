"""`nodeprep health`: the GPUs' health after the join (NVML, NVML's Xid/ECC events, the kernel's Xid
lines), once or as the service, and with --apply the Node condition GPUHealthy (docs/node.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import InputError
from ..health.condition import Publisher, condition, current_condition, write_condition
from ..health.service import KMSG, Settings, Stop, judge, look_once, serve
from ..kubeapi import connection, default_node_name, load_kubeconfig, read_node
from ..profile import load_profile, profile_path
from ..runtime.files import under
from .clioptions import check_option, emit_json, node_options

if TYPE_CHECKING:
    from ..health.verdict import NodeVerdict
    from ..kubeapi import KubeConfig

KUBELET_CONF = "/etc/kubernetes/kubelet.conf"


@click.command("health")
@node_options
@click.option("--apply", "do_apply", is_flag=True,
              help="Write the Node condition GPUHealthy (the node's own credential suffices).")
@click.option("--watch", is_flag=True,
              help="Run as the service: watch NVML's events and the kernel log until stopped.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Credentials for --apply (default: {KUBELET_CONF} under --root, the kubelet's).")
@click.option("--node", default=None,
              help="Node name (default: profile cluster.node_name, else the host name).")
@click.option("--hold", type=click.FloatRange(0, 86400), default=60.0, show_default=True,
              help="Seconds a GPU must stay healthy before it counts as healthy again (no flapping).")
@click.option("--xid-window", type=click.FloatRange(1, 7 * 86400), default=3600.0, show_default=True,
              help="Seconds an Xid whose action is not `ignore` keeps its GPU unhealthy.")
@click.option("--interval", type=click.FloatRange(1, 3600), default=2.0, show_default=True,
              help="--watch: seconds between reads of the GPUs' state when no event comes.")
@click.option("--heartbeat", type=click.FloatRange(1, 3600), default=60.0, show_default=True,
              help="--watch --apply: seconds after which an unchanged condition is written again "
                   "(`verify-nodes --health-stale` counts an older one as Unknown).")
@click.option("--kmsg", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Kernel log to read Xid lines from (default /dev/kmsg; a file of records or "
                   "dmesg lines works too).")
@click.option("--no-kmsg", is_flag=True, help="Do not read the kernel log (NVML's events only).")
@check_option("With --apply: print the condition it would write; the Node is read, not changed.")
def health_cmd(profile: Path | None, root: Path, as_json: bool, do_apply: bool, watch: bool,
               kubeconfig: Path | None, node: str | None, hold: float, xid_window: float, interval: float,
               heartbeat: float, kmsg: Path | None, no_kmsg: bool, check: bool) -> None:
    """Judge every GPU: lost, Xid errors (classed by NVIDIA's Xid catalog), uncorrected ECC, pending
    or failed row remaps, pending page retirements, NVLink links down, fabric not COMPLETED. Exit 0
    when all are healthy, 1 when one is not, 2 for bad input."""
    if watch and check:
        raise InputError("--watch and --check: a plan is one look (drop --watch)")
    settings = Settings(hold=hold, xid_window=xid_window, interval=interval,
                        kmsg=None if no_kmsg else (kmsg or KMSG), root=root)
    cfg, name = _cluster(root, profile, kubeconfig, node) if do_apply else (None, None)
    if watch:
        _watch(settings, cfg, name, heartbeat)
        return
    obs, notes = look_once(settings)
    _, verdict = judge(obs, settings)
    result = verdict.to_dict()
    result["notes"] = notes
    if cfg is not None and name is not None:
        result.update(_apply_once(cfg, name, verdict, check))
    if as_json:
        emit_json(result)
    else:
        for note in notes:
            click.echo(f"note: {note}", err=True)
        for g in verdict.gpus:
            state = "healthy" if g.healthy else f"UNHEALTHY ({g.action}): " + "; ".join(
                f.detail for f in g.blocking)
            click.echo(f"{g.name()}: {state}")
        click.echo(f"GPUHealthy={verdict.status} reason {verdict.reason}")
    if not verdict.healthy:
        sys.exit(1)


def _cluster(root: Path, profile: Path | None, kubeconfig: Path | None,
             node: str | None) -> tuple[KubeConfig, str]:
    prof = None
    path = profile_path(root, profile)
    if profile is not None or path.is_file():
        prof = load_profile(path)
    conf = kubeconfig or under(root, KUBELET_CONF)
    if not conf.is_file():
        raise InputError(f"--kubeconfig {conf}: no such file", hint="--apply needs the node's kubeconfig")
    name = node or (prof.cluster.node_name if prof and prof.cluster else None) or default_node_name()
    return load_kubeconfig(conf), name


def _apply_once(cfg: KubeConfig, name: str, verdict: NodeVerdict, check: bool) -> dict[str, object]:
    if check:
        cond = condition(verdict, current_condition(read_node(cfg, name)), "(now)")
        click.echo(f"node {name}: would set GPUHealthy={cond['status']} reason {cond['reason']}", err=True)
        return {"would_write": {"node": name, "condition": cond}}
    cond = write_condition(cfg, name, verdict)
    click.echo(f"node {name}: GPUHealthy={cond['status']} reason {cond['reason']}", err=True)
    return {"written": {"node": name, "condition": cond}}


def _watch(settings: Settings, cfg: KubeConfig | None, name: str | None, heartbeat: float) -> None:
    def echo(line: str) -> None:
        click.echo(line, err=True)

    if cfg is None:
        serve(settings, None, echo, Stop())
        return
    publisher = Publisher(cfg, name or "", heartbeat=heartbeat)
    with connection(cfg) as conn:
        serve(settings, lambda v: publisher.offer(v, conn), echo, Stop())


COMMANDS = [health_cmd]
