"""`nodeprep labels`: print (or apply) this node's GPU/machine labels."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from ..atomicfile import atomic_write
from ..errors import InputError, NodeprepError
from ..labels import output
from ..labels.cloud import Endpoints
from ..labels.profilelabels import ProfileLabels, profile_labels
from ..labels.validate import check_kubelet_labels, parse_label_arg, split_for_kubelet
from ..node.gpufacts import Recording
from ..node.labeling import GPU_SOURCES, LabelNode, label_node
from ..profile import profile_path
from ..profile.overrides import section_with
from .clioptions import (
    check_option,
    override_options,
    pop_overrides,
    profile_option,
    root_option,
    section_flags,
    sysfs_root_option,
)

log = logging.getLogger("nodeprep.labels")


@click.command("labels")
@click.option("--format", "fmt", type=click.Choice(output.FORMATS), default="json", show_default=True,
              help="kubelet: the --node-labels value (self-settable labels only); "
                   "nfd: an NFD features.d file.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write to FILE (atomically) instead of stdout.")
@click.option("--label", "extra_labels", multiple=True, metavar="KEY=VALUE",
              help="Extra label (repeatable); wins over the profile's labels.extra.")
@override_options(*section_flags("labels"))  # every labels field with a flag: a new one appears here
@sysfs_root_option
@click.option("--dmi-root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Stands for /sys/class/dmi/id (default: under --sysfs-root).")
@click.option("--nvidia-smi-xml", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Read GPU facts from this `nvidia-smi -q -x` capture.")
@click.option("--source", "gpu_source", type=click.Choice(GPU_SOURCES), default="auto", show_default=True,
              help="Where GPU facts come from: auto = NVML, then nvidia-smi, then PCI sysfs; a named source "
                   "is the only one asked, and its absence is an error (exit 1).")
@click.option("--pci-ids", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="pci.ids database (default: the distribution's).")
@click.option("--aws-metadata-url", envvar="NODEPREP_AWS_METADATA_URL", default=None, metavar="URL")
@click.option("--gce-metadata-url", envvar="NODEPREP_GCE_METADATA_URL", default=None, metavar="URL")
@click.option("--azure-metadata-url", envvar="NODEPREP_AZURE_METADATA_URL", default=None, metavar="URL")
@click.option("--timeout", type=click.FloatRange(0.05, 30), default=1.0, show_default=True,
              help="Seconds per fact source (all sources together: 1.5x this).")
@click.option("--apply", "do_apply", is_flag=True, help="Patch the Node's labels through the API.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Credentials for --apply.")
@click.option("--node", default=None, help="Node name for --apply (default: profile cluster.node_name, "
              "else the host name).")
@check_option("Print what --out and --apply would change (the file, the Node's patch) and change nothing.")
@profile_option
@root_option
def labels_cmd(fmt: str, as_json: bool, out: Path | None, extra_labels: tuple[str, ...],
               sysfs_dir: Path | None, dmi_root: Path | None,
               nvidia_smi_xml: Path | None, gpu_source: str, pci_ids: Path | None,
               aws_metadata_url: str | None,
               gce_metadata_url: str | None, azure_metadata_url: str | None, timeout: float, do_apply: bool,
               kubeconfig: Path | None, node: str | None, check: bool, profile: Path | None,
               root: Path, **overrides: Any) -> None:
    """Compute this node's labels (GFD-compatible nvidia.com/*, instance type, topology, nodeprep.dev/*)
    and print them, write them for NFD, or apply them to the Node."""
    fmt = "json" if as_json else fmt
    if profile is None and profile_path(root, None).is_file():
        profile = profile_path(root, None)
    prof = section_with(profile_labels(profile) if profile is not None else ProfileLabels(), "labels",
                        pop_overrides(overrides))
    cli_extra = dict(parse_label_arg(t) for t in extra_labels)
    extra = {**prof.extra, **cli_extra}
    if do_apply and kubeconfig is None:
        raise InputError("--apply needs --kubeconfig FILE")
    if fmt == "kubelet":
        check_kubelet_labels(extra)
    labelled = label_node(root, LabelNode(prof, check=check, source=gpu_source, options=dict(
        extra=extra, sysfs_root=sysfs_dir, dmi_root=dmi_root, nvidia_smi_xml=nvidia_smi_xml,
        pci_ids=pci_ids,
        endpoints=Endpoints.from_env(aws=aws_metadata_url, gce=gce_metadata_url, azure=azure_metadata_url),
        source_timeout=timeout, total_timeout=timeout * 1.5)))
    result, facts = labelled.result, labelled.facts
    for w in result.warnings:
        log.warning("warning: %s", w)
    name = node or prof.node_name or None
    if labelled.facts_warning:
        log.warning("warning: %s", labelled.facts_warning)
    if check:
        _print_plan(result.labels, _render(result, fmt), out, kubeconfig if do_apply else None, name, facts)
        return
    applied = None
    if do_apply:
        # lazy: labels --help
        from ..kubeapi import default_node_name, load_kubeconfig
        from ..labels.nodepatch import apply_labels

        assert kubeconfig is not None
        applied = apply_labels(load_kubeconfig(kubeconfig), name or default_node_name(), result.labels)
        click.echo(f"node {applied.node}: " + ("labels updated" if applied.changed else "labels unchanged"),
                   err=True)
    text = _render(result, fmt, applied)
    if out is not None:
        atomic_write(out, text)
    else:
        click.echo(text, nl=False)
    if applied is not None and (line := applied.refused_line()):
        raise NodeprepError(line)


def _render(result: Any, fmt: str, applied: Any = None) -> str:
    if fmt == "kubelet":
        return output.render_kubelet(result.labels) + "\n"
    if fmt == "nfd":
        return output.render_nfd(result.labels)
    mine, api = split_for_kubelet(result.labels)
    data = {**result.to_dict(), "self_settable": sorted(mine), "needs_api": sorted(api)}
    if applied is not None:
        data["applied"] = {"node": applied.node, "changed": applied.changed, "patch": applied.patch,
                           "refused": list(applied.refused)}
    return output.render_json(data) + "\n" if fmt == "json" else output.render_yaml(data)


def _print_plan(labels: dict[str, str], text: str | None, out: Path | None, kubeconfig: Path | None,
                name: str | None, facts: Recording | None = None) -> None:
    """--check: what --out, --apply and the GPU facts (`facts`) would do, read
    from the files and the Node as they are."""
    if facts is not None:
        click.echo(f"would write {facts.file} (GPU facts)" if facts.changed else f"{facts.file}: unchanged")
    if out is not None:
        try:
            same = out.read_text() == text
        except (OSError, UnicodeDecodeError):
            same = False
        click.echo(f"{out}: unchanged" if same else f"would write {out} ({len(str(text).encode())} bytes)")
    if kubeconfig is not None:
        # lazy: labels --help
        from ..kubeapi import default_node_name, load_kubeconfig, read_node
        from ..labels.nodepatch import plan_patch

        name = name or default_node_name()
        patch = plan_patch(read_node(load_kubeconfig(kubeconfig), name), labels)
        changes = ((patch or {}).get("metadata") or {}).get("labels") or {}
        if patch is None:
            click.echo(f"node {name}: labels unchanged")
        for key, value in sorted(changes.items()):
            click.echo(f"node {name}: would remove {key}" if value is None
                       else f"node {name}: would set {key}={value}")
        if patch is not None and not changes:
            click.echo(f"node {name}: would record nodeprep's label keys (annotation)")
    if out is None and kubeconfig is None and facts is None:
        click.echo("nothing to write (no --out, no --apply)")


COMMANDS = [labels_cmd]
