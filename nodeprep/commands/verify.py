"""`nodeprep verify-gpus` (node side) and `nodeprep verify-nodes` (cluster side): a GPU node stays
tainted `nodeprep.dev/unverified:NoSchedule` until its GPU self-test passed (docs/join.md)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ..errors import InputError, NodeprepError
from ..join.verification import publish_verdict, verdict_patch, verify_nodes
from ..kubeapi import default_node_name, load_kubeconfig, read_node
from ..node.fabric import decide, read_pci
from ..node.selftest import evaluate, gather
from ..profile import load_profile, profile_path
from .clioptions import check_option, emit_json, json_option, node_options


def _boot_id(root: Path) -> str | None:
    try:
        return (root / "proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


@click.command("verify-gpus")
@node_options
@click.option("--sysfs-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/sys"),
              show_default=True, help="Stands for /sys (PCI devices, the nvidia module).")
@click.option("--nvidia-smi-xml", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Read GPU facts from this `nvidia-smi -q -x` capture instead of running nvidia-smi.")
@click.option("--persistence-mode", type=click.Choice(["any", "enabled", "disabled"]), default=None,
              help="Expected persistence mode (default: the profile's driver.persistence_mode).")
@click.option("--fabric-timeout", type=click.FloatRange(0, 3600), default=None, metavar="SECONDS",
              help="Wait this long for NVML's fabric state COMPLETED on NVLink-fabric GPUs (Fabric Manager "
              "registers them); a fabric still in progress then fails the self-test (default: the "
              "profile's driver.fabric_timeout, else 120).")
@click.option("--apply", "do_apply", is_flag=True,
              help="Publish the verdict on the Node (label nodeprep.dev/gpu-verified).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Credentials for --apply: the node's own (/etc/kubernetes/kubelet.conf) suffice.")
@click.option("--node", default=None,
              help="Node name (default: profile cluster.node_name, else the host name).")
@check_option("Run the self-test and print the verdict --apply would publish (the Node is read, not "
              "changed).")
def verify_gpus_cmd(profile: Path | None, root: Path, as_json: bool, sysfs_root: Path,
                    nvidia_smi_xml: Path | None, persistence_mode: str | None, fabric_timeout: float | None,
                    do_apply: bool,
                    kubeconfig: Path | None, node: str | None, check: bool) -> None:
    """Run the GPU self-test (loaded module = active driver, every GPU on the PCI bus visible, no
    pending row remaps or page retirements, persistence mode as configured, every NVLink fabric
    registered: NVML's fabric state COMPLETED, waited for); exit 1 when it fails.
    With --apply, publish the verdict so `nodeprep verify-nodes` can lift the node's taint."""
    if do_apply and kubeconfig is None:
        raise InputError("--apply needs --kubeconfig FILE")
    prof = None
    path = profile_path(root, profile)
    if profile is not None or path.is_file():
        prof = load_profile(path)
    mode = persistence_mode or (prof.driver.persistence_mode if prof else "any")
    verdict = evaluate(gather(root, sysfs_root, persistence_mode=mode, nvidia_smi_xml=nvidia_smi_xml,
                              fabric_timeout=fabric_timeout if fabric_timeout is not None
                              else prof.driver.fabric_timeout if prof else 120.0))
    result: dict[str, object] = verdict.to_dict()
    problems = list(verdict.problems)
    if do_apply:
        assert kubeconfig is not None
        name = node or (prof.cluster.node_name if prof and prof.cluster else None) or default_node_name()
        cfg = load_kubeconfig(kubeconfig)
        if check:  # the patch publish_verdict would send, against the Node as it is now
            _, pub = verdict_patch(read_node(cfg, name), verdict, _boot_id(root))
        else:
            pub = publish_verdict(cfg, name, verdict, _boot_id(root))
        key = "would_publish" if check else "published"
        result[key] = {"node": pub.node, "label": pub.value, "passed": pub.passed}
        problems = list(pub.problems)
        click.echo(f"node {pub.node}: {'would set ' if check else ''}nodeprep.dev/gpu-verified={pub.value}",
                   err=as_json or not check)
    if as_json:
        emit_json(result)
    elif not problems:
        click.echo(f"GPU self-test passed (driver {verdict.driver_version})")
    if problems:
        raise NodeprepError("GPU self-test failed: " + "; ".join(problems))


@click.command("verify-nodes")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="A credential allowed get/list/watch/patch on nodes (docs/join.md has the ClusterRole).")
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option("--interval", type=click.FloatRange(1, 3600), default=15.0, show_default=True,
              help="Seconds between passes.")
@click.option("--health-stale", type=click.FloatRange(1, 86400), default=180.0, show_default=True,
              metavar="SECONDS", help="A GPUHealthy heartbeat older than this counts as Unknown (the health "
              "reporter is silent): the node is tainted (default: three of its 60 s heartbeats).")
@check_option("One pass that prints the taint changes it would make and changes nothing.")
def verify_nodes_cmd(kubeconfig: Path, once: bool, interval: float, health_stale: float, check: bool) -> None:
    """Cluster side: lift nodeprep.dev/unverified:NoSchedule from nodes whose GPU self-test verdict is
    valid for their current boot and driver; put it back on GPU nodes without one. Keep
    nodeprep.dev/gpu-unhealthy:NoSchedule on nodes whose condition GPUHealthy is False (nodeprep
    health) or Unknown, or whose heartbeat is stale, and lift it when it is True again."""
    cfg = load_kubeconfig(kubeconfig)
    while True:
        try:
            lines = verify_nodes(cfg, check=check, stale_after=health_stale)
        except NodeprepError as e:  # the API server away or starting (503): next pass
            if once or check or isinstance(e, InputError):
                raise
            click.echo(f"warning: {e}; next pass in {interval:g}s", err=True)
            lines = []
        for line in lines:
            click.echo(line)
        if once or check:
            return
        time.sleep(interval)


@click.command("fabric-manager")
@json_option
@click.option("--sysfs-root", type=click.Path(file_okay=False, path_type=Path), default=Path("/sys"),
              show_default=True, help="Stands for /sys (the PCI devices and their VPD).")
@click.option("--condition", is_flag=True,
              help="Exit 0 when this machine needs Fabric Manager, 1 when not (systemd's ExecCondition).")
def fabric_manager_cmd(as_json: bool, sysfs_root: Path, condition: bool) -> None:
    """Say whether this machine needs NVIDIA Fabric Manager, from its PCI devices: NVSwitches (PCI class
    0x0680, HGX A100/H100/H200) or an NVSwitch management bridge (VPD SW_MNG, HGX B200/B300) need it;
    GB200/GB300 (switches managed off-host) and everything else do not."""
    decision = decide(read_pci(sysfs_root))
    if as_json:
        emit_json(decision.to_dict())
    else:
        says = "needed" if decision.needed else "not needed"
        click.echo(f"{decision.machine.name}: Fabric Manager {says} ({decision.reason})")
    if condition and not decision.needed:
        raise SystemExit(1)


COMMANDS = [verify_gpus_cmd, verify_nodes_cmd, fabric_manager_cmd]
