"""The `nodeprep` command line. Each concern's commands live in nodeprep/commands/<concern>.py and
export COMMANDS; this module only builds the group and translates errors into one line + exit code.

The group loads a command's module only when that command runs (or its help is asked for): COMMANDS
below names each command's module and its short help, so `nodeprep --help` lists every command
without importing any of them (the health service's resident memory, docs/design-decisions.md,
"A lazy command line"). tests/unit/test_cli_lazy.py holds the table to the commands themselves.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import click

from . import __version__
from .errors import NodeprepError
from .log import setup_logging

log = logging.getLogger("nodeprep")


def _build() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import build

    return build.COMMANDS


def _install() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import install

    return install.COMMANDS


def _labels() -> list[click.Command]:
    # lazy: nodeprep --help, import nodeprep.cli
    from .commands import labels

    return labels.COMMANDS


def _join() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import join

    return join.COMMANDS


def _profile() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import profile

    return profile.COMMANDS


def _smoke() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import smoketest

    return smoketest.COMMANDS


def _bootstrap() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import bootstrap

    return bootstrap.COMMANDS


def _verify() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import verify

    return verify.COMMANDS


def _mig() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import mig

    return mig.COMMANDS


def _health() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import health

    return health.COMMANDS


def _upgrade() -> list[click.Command]:
    # lazy: nodeprep --help, labels --help, import nodeprep.cli
    from .commands import upgrade

    return upgrade.COMMANDS


Loader = Callable[[], list[click.Command]]

# command -> (the loader of its module's COMMANDS, its short help: the first sentence of its docstring)
COMMANDS: dict[str, tuple[Loader, str]] = {
    "build-driver": (_build, 'Build the NVIDIA kernel modules for one kernel release into the store.'),
    "build-matrix": (_build, 'Expand an OS x kernels x drivers x flavours matrix (YAML) for a CI system, or '
                             'build it.'),
    "artifacts": (_build, 'Inspect and verify an artifact store.'),
    "install": (_install, 'Install a driver version from a store into /opt/nvidia/VERSION (side by side).'),
    "activate": (_install, 'Make an installed VERSION (default: driver.version of the profile) the active '
                           'driver (atomic switch of /opt/nvidia/current).'),
    "rollback": (_install, 'Activate the previously active driver version.'),
    "list": (_install, 'Installed driver versions (* active, < previous): size, install time, kernels and '
                       'their module flavour; --json adds what doctor works from.'),
    "remove": (_install, 'Delete an installed, inactive driver VERSION (only what nodeprep installed).'),
    "doctor": (_install, 'Check the active driver (loaded module vs user space, device nodes, ld cache, '
                         "CUDA) and the node's container hooks."),
    "load-modules": (_install, "Load the active driver's modules and create /dev/nvidia* (run by "
                               'nodeprep-nvidia.service).'),
    "kernel-hook": (_install, 'Run by /etc/kernel/{postinst,postrm}.d/nodeprep for KERNEL: install (or, once '
                              "removed, delete) the active driver's modules for it."),
    "uninstall": (_install, 'Return the node to what it was before nodeprep: every driver version, '
                            '`current`, the unit, the kernel hooks, ld.so.conf.d and modprobe.d entries, '
                            'entry points, the containerd drop-in and CDI spec nodeprep wrote (only files '
                            'nodeprep made; any other is left and named).'),
    "labels": (_labels, "Compute this node's labels (GFD-compatible nvidia.com/*, instance type, topology, "
                        'nodeprep.dev/*) and print them, write them for NFD, or apply them to the Node.'),
    "join": (_join, "Join this node to Kubernetes as the profile's cluster section says."),
    "runtime": (_join, 'Register the nvidia runtime in containerd and write the CDI spec (no cluster join).'),
    "profile": (_profile, 'The node profile (docs/profile.md).'),
    "smoke-test": (_smoke, "Boot the artifact's kernel in qemu and load its modules (no GPU needed)."),
    "bootstrap": (_bootstrap, 'Bring this node up from its profile: driver, modules + doctor, MIG layout, '
                              'labels, container runtime, join.'),
    "cloud-init": (_bootstrap, 'Render cloud-init user-data that installs nodeprep on a new node and runs '
                               '`nodeprep bootstrap`.'),
    "verify-gpus": (_verify, 'Run the GPU self-test (loaded module = active driver, every GPU on the PCI bus '
                             'visible, no pending row remaps or page retirements, persistence mode as '
                             "configured, every NVLink fabric registered: NVML's fabric state COMPLETED, "
                             'waited for); exit 1 when it fails.'),
    "verify-nodes": (_verify, 'Cluster side: lift nodeprep.dev/unverified:NoSchedule from nodes whose GPU '
                              'self-test verdict is valid for their current boot and driver; put it back on '
                              'GPU nodes without one.'),
    "fabric-manager": (_verify, 'Say whether this machine needs NVIDIA Fabric Manager, from its PCI devices: '
                                'NVSwitches (PCI class 0x0680, HGX A100/H100/H200) or an NVSwitch management '
                                'bridge (VPD SW_MNG, HGX B200/B300) need it; GB200/GB300 (switches managed '
                                'off-host) and everything else do not.'),
    "mig": (_mig, "Put mig.config's selected mig-config (mig.select) in place on this host's GPUs: MIG mode, "
                  'then the MIG devices; nothing when it is in place.'),
    "health": (_health, "Judge every GPU: lost, Xid errors (classed by NVIDIA's Xid catalog), uncorrected "
                        'ECC, pending or failed row remaps, pending page retirements, NVLink links down, '
                        'fabric not COMPLETED.'),
    "upgrade": (_upgrade, 'Driver rollouts across a fleet: a per-node state label '
                          '(nodeprep.dev/upgrade-state), only GPU pods evicted, batches and budgets '
                          '(docs/fleet.md, "Upgrades").'),
}


class LazyCommands(MutableMapping[str, click.Command]):
    """The group's `commands`: every name of COMMANDS is there; its command is made (its module
    imported) when it is first looked up."""

    def __init__(self, table: dict[str, tuple[Loader, str]]) -> None:
        self.table = table
        self.loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded and name in self.table:
            for cmd in self.table[name][0]():
                if cmd.name is not None:
                    self.loaded.setdefault(cmd.name, cmd)
        return self.loaded[name]

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self.loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        self.loaded.pop(name)
        self.table.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self.table or name in self.loaded

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self.table) | set(self.loaded)))

    def __len__(self) -> int:
        return len(set(self.table) | set(self.loaded))

    def short_help(self, name: str, limit: int) -> str:
        """What `--help` lists for `name`, without loading it when it is not loaded yet."""
        if name in self.loaded:
            return self.loaded[name].get_short_help_str(limit)
        return click.Command(name, help=self.table[name][1]).get_short_help_str(limit)


class NodeprepGroup(click.Group):
    """Runs a command and turns NodeprepError and click's usage errors into `error: ...` on stderr
    without a traceback; its commands are loaded when they run (LazyCommands)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(dict(COMMANDS))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names or not isinstance(self.commands, LazyCommands):
            super().format_commands(ctx, formatter)
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, self.commands.short_help(n, limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            # lazy: nodeprep --help, labels --help, import nodeprep.cli
            from .commands.usage import usage_line

            click.echo(f"error: {usage_line(e)}", err=True)
            raise click.exceptions.Exit(e.exit_code) from None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            # lazy: nodeprep --help, labels --help, import nodeprep.cli
            from .commands.usage import usage_line

            click.echo(f"error: {usage_line(e)}", err=True)
            ctx.exit(e.exit_code)
        except NodeprepError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            if e.hint:
                for line in e.hint.splitlines():
                    click.echo(f"  {line}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=NodeprepGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nodeprep")
@click.option("-v", "--verbose", count=True, help="More output (commands run, their output).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool, debug: bool) -> None:
    """Build NVIDIA drivers ahead of time, install them into versioned roots, label GPU nodes
    and join them to Kubernetes."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    setup_logging(verbose, quiet)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
