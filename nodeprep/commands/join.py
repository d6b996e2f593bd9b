"""join commands (see nodeprep/cli.py): `nodeprep join`, `nodeprep runtime`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from ..join.joining import JoinRequest, join_cluster
from ..node import oplog
from ..profile import load_profile, profile_path, with_overrides
from ..runtime.configure import RuntimeRequest, configure_runtime
from .clioptions import check_option, emit_json, node_options, override_options, path_option, pop_overrides

log = logging.getLogger("nodeprep.join")
nvidia_smi_xml_option = path_option(
    "--nvidia-smi-xml", exists=True,
    help="Read the GPU list from this `nvidia-smi -q -x` capture instead of asking the driver "
    "(offline image builds).",
)
dev_root_option = path_option(
    "--dev-root", directory=True, exists=True,
    help="Look for the device nodes and daemon sockets the CDI spec names under DIR instead of "
    "--root (an image being built: --dev-root /).",
)


def applied_changes(result: dict[str, Any]) -> list[str]:
    """The node operation log's lines for an applied join or runtime plan: files written (paths
    only, never content) and commands run (argv never holds a secret)."""
    return [f"wrote {t}" for t in result["written"]] + [f"ran {' '.join(a)}" for a in result["ran"]]


def _warn(warnings: list[str] | tuple[str, ...]) -> None:
    for w in warnings:
        log.warning("warning: %s", w)


@click.command("join")
@node_options
@check_option(
    "Change nothing: print every file the join would write (diffs against what is there, token "
    "masked), the commands it would run and what preflight found (only a real join refuses).",
    "--dry-run",
)
@path_option("--output-dir", directory=True,
             help="With --check: also write the files under DIR (DIR/etc/...), not on the node.")
@click.option(
    "--insecure-skip-ca-verification",
    is_flag=True,
    help="Join without cluster.ca_cert_hashes (kubeadm unsafeSkipCAVerification). Trusts the network.",
)
@click.option("--skip-preflight", is_flag=True, help="Join even when `nodeprep doctor` fails.")
@click.option("--skip-discovery", is_flag=True,
              help="Do not check the token and CA pin against the API server first (offline image "
              "builds that cannot reach it).")
@click.option("--discovery-timeout", type=click.FloatRange(0, 3600), default=60.0, show_default=True,
              metavar="SECONDS", help="How long to wait for the cluster to know the bootstrap token.")
@nvidia_smi_xml_option
@override_options(
    "cluster.api_server", "cluster.token_file", "cluster.kubernetes_version", "cluster.node_name",
    "health.hold",
)
def join_cmd(
    profile: Path | None,
    root: Path,
    as_json: bool,
    check: bool,
    output_dir: Path | None,
    insecure_skip_ca_verification: bool,
    skip_preflight: bool,
    skip_discovery: bool,
    discovery_timeout: float,
    nvidia_smi_xml: Path | None,
    **overrides: str | None,
) -> None:
    """Join this node to Kubernetes as the profile's cluster section says.

    kubeadm mode renders a JoinConfiguration (v1beta3 below 1.31, v1beta4 from 1.31) and runs
    `kubeadm join --config FILE`; kubelet mode writes a bootstrap kubeconfig, KubeletConfiguration
    and a kubelet.service drop-in and restarts kubelet. Both register the nvidia runtime in
    containerd and write the CDI spec first. The bootstrap token is read from cluster.token_file
    (mode 0600) and never printed."""
    unpinned = {"insecure_skip_ca_verification": insecure_skip_ca_verification}
    prof = with_overrides(load_profile(profile_path(root, profile), **unpinned), pop_overrides(overrides),
                          **unpinned)
    if output_dir is not None and not check:
        raise click.UsageError("--output-dir goes with --check (a join writes under --root)")
    outcome = join_cluster(root, JoinRequest(
        prof, check=check, output_dir=output_dir, insecure_skip_ca_verification=insecure_skip_ca_verification,
        skip_preflight=skip_preflight, nvidia_smi_xml=nvidia_smi_xml, discovery=not skip_discovery,
        discovery_timeout=discovery_timeout))
    plan, result = outcome.plan, outcome.result
    if not check:
        oplog.record(root, "join", applied_changes(result))
    result["dry_run"] = check  # the key scripts read since --dry-run
    result["check"] = check
    if as_json:
        emit_json(result)
        return
    _warn(plan.warnings)
    head = (
        f"mode {plan.mode}, Kubernetes {plan.kubernetes_version}"
        f"{', ' + plan.kubeadm_api if plan.kubeadm_api else ''}"
    )
    if check:
        click.echo(plan.render_text(), nl=False)
        _warn([f"preflight: {p} (a real join refuses)" for p in plan.preflight])
        changed = sum(1 for f in plan.files if f.changed)
        where = f"; files under {output_dir}" if output_dir is not None else ""
        click.echo(f"would join: {head}; would write {changed} file(s), nothing changed{where}", err=True)
        return
    click.echo(
        f"joined: {head}; {len(result['written'])} file(s) written, {len(result['ran'])} command(s) run",
        err=True,
    )


@click.command("runtime")
@node_options
@check_option("Only report what would change (nothing written).")
@nvidia_smi_xml_option
@dev_root_option
@click.option("--insecure-skip-ca-verification", is_flag=True,
              help="Accept a kubeadm profile without cluster.ca_cert_hashes, for a node that joins with "
              "`join --insecure-skip-ca-verification`.")
def runtime_cmd(
    profile: Path | None, root: Path, as_json: bool, check: bool, nvidia_smi_xml: Path | None,
    dev_root: Path | None, insecure_skip_ca_verification: bool,
) -> None:
    """Register the nvidia runtime in containerd and write the CDI spec (no cluster join)."""
    prof = load_profile(profile_path(root, profile),
                        insecure_skip_ca_verification=insecure_skip_ca_verification)
    outcome = configure_runtime(root, RuntimeRequest(prof, check=check, nvidia_smi_xml=nvidia_smi_xml,
                                                     dev_root=dev_root))
    plan, summary = outcome.plan, [f.summary() for f in outcome.files]
    if outcome.applied is None:
        result = {
            "changed": plan.changed,
            "files": summary,
            "commands": [list(a.argv) for a in plan.actions],
            "warnings": list(plan.warnings),
            "preflight": list(plan.preflight),
        }
    else:
        result = outcome.applied
        oplog.record(root, "runtime", applied_changes(result))
        result["files"] = summary
    if as_json:
        emit_json(result)
        return
    _warn(plan.warnings)
    _warn([f"preflight: {p} (a real run refuses)" for p in plan.preflight])
    for f in summary:
        click.echo(f"{f['path']}: {'changed' if f['changed'] else 'unchanged'}")


COMMANDS: list[click.Command] = [join_cmd, runtime_cmd]
