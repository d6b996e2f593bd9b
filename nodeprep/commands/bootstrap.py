"""bootstrap commands: `nodeprep bootstrap` (one-shot node bring-up) and `nodeprep cloud-init`
(user-data that installs nodeprep on a new node and runs bootstrap)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from .. import bootstrap as bootstrap_lib
from .. import cloudinit
from ..errors import InputError
from ..node import oplog
from ..profile import parse_profile, profile_path, read_profile
from .clioptions import check_option, emit_json, json_option, root_option, sysfs_root_option

log = logging.getLogger(__name__)


def _profile_path(profile: Path | None, root: Path) -> Path:
    if profile is not None:
        return profile
    default = profile_path(root, None)
    if not default.exists():
        raise InputError(f"{default}: no profile (pass --profile FILE)")
    return default


def _deprecated_dry_run_join(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        log.warning("warning: --dry-run-join is deprecated; --check shows the plan and changes nothing "
                    "(this run installs and writes as before, only the join command is not run)")
    return value


@click.command("bootstrap")
@click.option("--profile", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Node profile (default /etc/nodeprep/node.yaml under --root).")
@root_option
@json_option
@check_option("Show the whole bring-up plan and change nothing (no record, no log): each step's plan, "
              "and what the gates find on the node as it is now as `preflight` warnings.")
@click.option("--dry-run-join", is_flag=True, hidden=True, callback=_deprecated_dry_run_join,
              help="Deprecated: run every step but only write the join configuration (see --check).")
@click.option("--restart", is_flag=True, help="Ignore recorded progress and run every step again.")
@sysfs_root_option
@click.option("--nvidia-smi-xml", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Read GPU facts from this `nvidia-smi -q -x` capture (images, offline preparation).")
@click.option("--load-modules/--no-load-modules", default=None,
              help="Load the kernel modules (default: only when --root is /).")
@click.option("--mig/--no-mig", "mig", default=None,
              help="Put the profile's mig.config in place through this host's NVML (default: only when "
                   "--root is /).")
@click.option("--nvml/--no-nvml", "nvml", default=None,
              help="Label the GPUs from this host's NVML, as for a root whose GPUs are this host's "
                   "(default: only when --root is /).")
def bootstrap_cmd(profile: Path | None, root: Path, as_json: bool, check: bool, dry_run_join: bool,
                  restart: bool, sysfs_dir: Path | None, nvidia_smi_xml: Path | None,
                  load_modules: bool | None, mig: bool | None, nvml: bool | None) -> None:
    """Bring this node up from its profile: driver, modules + doctor, MIG layout, labels, container
    runtime, join.

    Progress is recorded per step in /var/lib/nodeprep/bootstrap.json: rerun after a failure to
    resume at the failed step; a rerun after success changes nothing.
    """
    path = _profile_path(profile, root)
    warned: set[str] = set()
    found: set[str] = set()

    def show(outcome: bootstrap_lib.Outcome) -> None:
        if outcome.status == "done" and not check:
            oplog.record(root, "bootstrap", [f"{outcome.name}: {outcome.result.get('summary', 'done')}"])
        if as_json:
            return  # the warnings are in each step's result
        for w in bootstrap_lib.new_warnings(outcome, warned):
            log.warning("warning: %s", w)
        for finding in bootstrap_lib.new_warnings(outcome, found, key="preflight"):
            log.warning("warning: preflight: %s (on the node as it is now)", finding)
        click.echo(bootstrap_lib.describe(outcome), err=True)

    options = bootstrap_lib.Options(dry_run_join=dry_run_join, check=check,
                                    sysfs_root=sysfs_dir, nvidia_smi_xml=nvidia_smi_xml,
                                    load_modules=load_modules, mig=mig, nvml=nvml)
    report = bootstrap_lib.bootstrap(path, root=root, options=options, restart=restart, on_outcome=show)
    if as_json:
        emit_json({**report.to_json(), "check": check})
    else:
        click.echo(bootstrap_lib.summary_line(report, check=check), err=True)
        failed = next((o for o in report.outcomes if o.status == "failed"), None)
        if failed is not None:  # the one error: line of a refusal, after the journal
            click.echo(f"error: bootstrap: {failed.name}: {failed.error}", err=True)
    if not report.ok:
        click.get_current_context().exit(report.exit_code)


@click.command("cloud-init")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="Node profile to write onto the node as /etc/nodeprep/node.yaml.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the user-data here (default: stdout).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Bootstrap token to place at the profile's cluster.token_file (0600) on the node.")
@click.option("--registry-auth", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Registry credentials (docker config.json, mode 0600) to write at the profile's "
                   "driver.registry_auth (0600) on the node.")
@click.option("--ca-file", "store_ca_file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None,
              help="CA bundle of the store to write at the profile's driver.ca_file on the node.")
@click.option("--store-ca-file", "old_store_ca_file", hidden=True, default=None,
              type=click.Path(dir_okay=False, exists=True, path_type=Path))  # deprecated: --ca-file
@click.option("--ca-cert-hash", "ca_hashes", multiple=True, metavar="sha256:HEX",
              help="CA public key pin (repeatable); added to the profile and written to "
                   f"{cloudinit.CA_HASHES_PATH}.")
@click.option("--nodeprep-from", "source", type=click.Choice(["store", "index"]), default="store",
              show_default=True, help="Install nodeprep from the artifact store (sha256-checked wheel) or "
                                      "from the package index.")
@click.option("--nodeprep-wheel", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Local copy of the wheel published in the store (for its sha256), when the store is "
                   "remote.")
@click.option("--nodeprep-requirement", default=None, help="pip requirement for --nodeprep-from index "
              "(default nodeprep==<this version>).")
@click.option("--os-family", type=click.Choice(["debian", "rhel"]), default="debian", show_default=True,
              help="Distribution family of the node image (package names, python).")
@click.option("--format", "fmt", type=click.Choice(["auto", "cloud-config", "mime"]), default="auto",
              show_default=True, help="auto: plain #cloud-config, MIME multipart when --part is given.")
@click.option("--part", "parts", multiple=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Operator part (#cloud-config or #! script) appended after ours (MIME; lists merge by "
                   "appending). Repeatable.")
@click.option("--limit", type=click.IntRange(min=1024), default=cloudinit.AWS_USER_DATA_LIMIT,
              show_default=True, help="Maximum raw user-data size in bytes (AWS 16384).")
@click.option("--no-gzip", is_flag=True, help="Never gzip the whole user-data (some tools want text).")
@click.option("--publish-wheel", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="First copy this nodeprep wheel into <store>/tools/ (the profile's driver.store must be "
                   "a local directory).")
@check_option("Render and check the user-data and print what would be written (--out, --publish-wheel); "
              "write nothing.")
@json_option
def cloud_init_cmd(profile_path: Path, out: Path | None, token_file: Path | None,
                   registry_auth: Path | None, store_ca_file: Path | None, ca_hashes: tuple[str, ...],
                   source: str, nodeprep_wheel: Path | None, nodeprep_requirement: str | None,
                   os_family: cloudinit.OsFamily, fmt: cloudinit.Format, parts: tuple[Path, ...],
                   limit: int, no_gzip: bool, publish_wheel: Path | None, check: bool, as_json: bool,
                   old_store_ca_file: Path | None = None) -> None:
    """Render cloud-init user-data that installs nodeprep on a new node and runs `nodeprep bootstrap`.

    The token is written as a file (mode 0600), never into runcmd. Output stays under --limit bytes:
    write_files contents are gzip+base64'd, then the whole user-data gzipped, when needed.
    """
    if as_json and out is None:
        raise InputError("--json prints a summary only: pass --out FILE for the user-data")
    if old_store_ca_file is not None:  # the table's name for driver.ca_file is --ca-file, as install's
        log.warning("warning: --store-ca-file is deprecated; use --ca-file")
        store_ca_file = store_ca_file or old_store_ca_file
    spec = build_spec(profile_path, token_file=token_file, ca_hashes=ca_hashes, source=source,
                      nodeprep_wheel=nodeprep_wheel, nodeprep_requirement=nodeprep_requirement,
                      os_family=os_family, parts=parts, publish_wheel=publish_wheel,
                      registry_auth=registry_auth, store_ca_file=store_ca_file, check=check)
    user_data = cloudinit.render(spec, fmt=fmt, limit=limit, allow_gzip=not no_gzip)
    if check:
        _print_cloud_init_plan(user_data, out, 0o600 if spec.secret else 0o644, spec, publish_wheel,
                               as_json)
        return
    if out is not None:
        out.write_bytes(user_data.data)
        out.chmod(0o600 if spec.secret else 0o644)
    else:
        sys.stdout.buffer.write(user_data.data)
        sys.stdout.flush()
    summary = {"format": user_data.format, "size": user_data.size, "limit": user_data.limit,
               "out": str(out) if out else None, "nodeprep_from": spec.source.mode,
               "nodeprep_url": spec.source.url, "token": bool(spec.token)}
    if as_json:
        emit_json(summary)
    else:
        log.info("user-data: %s, %d bytes (limit %d)%s", user_data.format, user_data.size, user_data.limit,
                 f" -> {out}" if out else "")


def _print_cloud_init_plan(user_data: Any, out: Path | None, mode: int, spec: cloudinit.UserDataSpec,
                           publish_wheel: Path | None, as_json: bool) -> None:
    """--check: the files cloud-init would write, each compared with what is there."""
    plan: list[str] = []
    if publish_wheel is not None:
        plan.append(f"would copy {publish_wheel} to {spec.source.url}")
    if out is None:
        plan.append(f"would print the user-data ({user_data.format}, {user_data.size} bytes, limit "
                    f"{user_data.limit})")
    else:
        try:
            same = out.read_bytes() == user_data.data and (out.stat().st_mode & 0o777) == mode
        except OSError:
            same = False
        plan.append(f"{out}: unchanged" if same else
                    f"would write {out} ({user_data.format}, {user_data.size} bytes, mode {mode:04o})")
    if as_json:
        emit_json({"check": True, "plan": plan, "format": user_data.format, "size": user_data.size,
                   "limit": user_data.limit, "out": str(out) if out else None})
        return
    for line in plan:
        click.echo(line)


def build_spec(profile_path: Path, *, token_file: Path | None, ca_hashes: tuple[str, ...], source: str,
               nodeprep_wheel: Path | None, nodeprep_requirement: str | None,
               os_family: cloudinit.OsFamily, parts: tuple[Path, ...], publish_wheel: Path | None,
               registry_auth: Path | None = None, store_ca_file: Path | None = None,
               check: bool = False) -> cloudinit.UserDataSpec:
    """Validate the inputs and assemble what the user-data is made of. `check`: a --publish-wheel
    is checked, not copied (the user-data names it where it would be)."""
    text, document = read_profile(profile_path)  # the same reader and checks as join/profile check
    hashes = cloudinit.check_ca_hashes(ca_hashes)
    # --ca-cert-hash supplies the pins the profile may lack: the merged profile is validated again
    profile = parse_profile(document.data, str(profile_path), document,
                            insecure_skip_ca_verification=bool(hashes))
    if hashes:
        if profile.cluster is None:
            raise InputError(f"--ca-cert-hash: {profile_path} has no cluster section to join")
        merged = tuple(dict.fromkeys([*profile.cluster.ca_cert_hashes, *hashes]))
        if merged != tuple(profile.cluster.ca_cert_hashes):
            data = document.data
            data["cluster"]["ca_cert_hashes"] = list(merged)
            text = yaml.safe_dump(data, sort_keys=False)
            profile = parse_profile(data, str(profile_path), document)
        hashes = merged
    elif profile.cluster is not None:
        hashes = tuple(profile.cluster.ca_cert_hashes)
    token = None
    if token_file is not None:
        if profile.cluster is None:
            raise InputError(f"--token-file: {profile_path} has no cluster section to join")
        token = cloudinit.read_token(token_file)
    store = profile.driver.store
    if publish_wheel is not None:
        if not store or "://" in store and not store.startswith("file://"):
            raise InputError(f"--publish-wheel: driver.store {store!r} is not a local directory")
        local = Path(store.removeprefix("file://"))
        if check:
            cloudinit.published_wheel(local, publish_wheel)
            nodeprep_wheel = publish_wheel  # the same bytes as the copy would be: its sha256
        else:
            nodeprep_wheel = cloudinit.publish_wheel(local, publish_wheel)
    if source == "store" and not cloudinit.OS_PACKAGES[os_family]["deps"]:
        raise InputError(f"--os-family {os_family}: nodeprep's dependencies are not packaged for its python; "
                         "use --nodeprep-from index")
    if source == "store":
        if not store:
            raise InputError(f"{profile_path}: driver.store is not set (needed for --nodeprep-from store)")
        src = cloudinit.store_source(store, wheel=nodeprep_wheel)
    else:
        src = cloudinit.index_source(nodeprep_requirement)
    return cloudinit.UserDataSpec(
        profile_text=text, source=src, token=token,
        token_path=cloudinit.token_path_for(profile.cluster), ca_cert_hashes=hashes,
        os_family=os_family,
        extra_parts=tuple(cloudinit.parse_part(p) for p in parts),
        store_files=cloudinit.store_files(profile.driver, registry_auth=registry_auth, ca_file=store_ca_file),
    )


COMMANDS = [bootstrap_cmd, cloud_init_cmd]
