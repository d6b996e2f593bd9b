"""smoke commands (see nodeprep/cli.py): `nodeprep smoke-test ARTIFACT`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import targets
from ..artifact import read_manifest
from ..builder.smoke import smoke_preview, smoke_test_artifact
from ..errors import NodeprepError
from ..paths import default_cache
from ..sources.debian import DebianArchive
from .clioptions import check_option, emit_json, json_option


def _preview(result: dict[str, Any], os_name: str | None, as_json: bool) -> None:
    """smoke-test --check, rendered (builder.smoke.smoke_preview)."""
    result["os"] = os_name or result["os"]
    if as_json:
        emit_json(result)
        return
    how = (", UEFI Secure Boot" if result["secure_boot"]
           else ", module.sig_enforce=1" if result["sig_enforce"] else "")
    click.echo(f"would boot kernel {result['kernel_release']} ({result['os']}{how}) in qemu with "
               f"{', '.join(result['modules'])} of {Path(result['artifact']).name}")
    fetch = ", ".join(result["would_fetch"]) or f"nothing (kernel {result['kernel_release']} is in the cache)"
    click.echo(f"  would fetch: {fetch}")
    click.echo("nothing changed (--check)", err=True)


@click.command("smoke-test")
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=default_cache(),
              show_default=True, help="Where kernel packages and their extracted trees are cached (the "
                                      "cache build-driver uses; $NODEPREP_CACHE).")
@click.option("--kernel", "kernel_release", default=None, metavar="RELEASE",
              help="Boot this kernel instead of the one the artifact was built for (needs --force).")
@click.option("--force", is_flag=True, help="Boot --kernel even though the artifact was built for another.")
@click.option("--sig-enforce", is_flag=True,
              help="Boot with module.sig_enforce=1: unsigned or untrusted-key modules are rejected.")
@click.option("--trust-cert", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="CERT",
              help="Boot under UEFI Secure Boot (OVMF) with CERT, the public certificate of the modules' "
                   "signing key, enrolled in db, as on a node that enrolled it (implies --sig-enforce).")
@click.option("--timeout", type=click.FloatRange(min=5), default=120, show_default=True,
              help="Seconds the boot may take before the test fails.")
@click.option("--console-log", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the whole serial console output of the boot to FILE.")
@click.option("--os", "os_name", default=None,
              help="Target OS whose archive serves the kernel (default: the artifact's own OS).")
@check_option("Print the kernel the test would boot and the packages it would fetch for it, from the "
              "artifact's manifest; nothing is downloaded, extracted or booted.")
@json_option
def smoke_test(artifact: Path, cache: Path, kernel_release: str | None, force: bool, sig_enforce: bool,
               trust_cert: Path | None, timeout: float, console_log: Path | None, os_name: str | None,
               check: bool, as_json: bool) -> None:
    """Boot the artifact's kernel in qemu and load its modules (no GPU needed).

    ARTIFACT is a kmod artifact (nvidia-kmod-<driver>-<flavour>-<kernel>.tar.zst). PASS when
    nvidia.ko gets as far as its GPU probe ("No NVIDIA GPU found") and every symbol of the other
    modules resolves; FAIL quotes the kernel's reason. Exit status 0 on PASS, 1 on FAIL.
    """
    if check:
        _preview(smoke_preview(artifact, cache=cache, kernel_release=kernel_release, force=force,
                               sig_enforce=sig_enforce, trusted_cert=trust_cert), os_name, as_json)
        return
    try:  # the archive of the kernel's own line (a backports kernel comes from bookworm-backports)
        manifest = read_manifest(artifact)
        os_name = os_name or manifest.os
        archive = DebianArchive(cache, os_name=os_name, kernel=kernel_release or manifest.kernel_release)
    except (OSError, NodeprepError):  # a missing artifact or a bad kernel name: reported just below
        archive = DebianArchive(cache, os_name=os_name or targets.DEFAULT)
    result = smoke_test_artifact(artifact, archive=archive, cache=cache, kernel_release=kernel_release,
                                 force=force, sig_enforce=sig_enforce, timeout=timeout,
                                 console_log=console_log, trusted_cert=trust_cert)
    if as_json:
        emit_json(result.to_dict() | {"passed": result.passed, "duration_s": round(result.duration_s, 1)})
    else:
        click.echo(f"{result.verdict}: {result.reason}")
        click.echo(f"  kernel {result.kernel_release}, {result.duration_s:.1f}s"
                   + (", UEFI Secure Boot" if result.secure_boot else "")
                   + (", module.sig_enforce=1" if result.sig_enforce else ""))
        for name, outcome in sorted(result.modules.items()):
            click.echo(f"  {name}: {outcome}")
        if result.log_excerpt:
            click.echo("  kernel log:")
            for line in result.log_excerpt.splitlines():
                click.echo(f"    {line}")
    if not result.passed:
        click.get_current_context().exit(1)


COMMANDS: list[click.Command] = [smoke_test]
