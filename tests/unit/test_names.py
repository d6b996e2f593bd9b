"""One set of names (issue #28): the profile's field table (nodeprep/profile/fields.py) is the
vocabulary. Each field's `flag` is a real option of the commands that take it, the Ansible roles'
variables map to field paths (the table below), node commands read their defaults from the profile
and flags override it, and click's own errors are nodeprep's one `error:` line (exit 2). Real CLI,
a store of small real artifacts (tests/support/standin.py), temporary roots."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import yaml

from nodeprep.cli import main
from nodeprep.errors import InputError
from nodeprep.profile.fields import FIELDS, field_by_path, field_error
from tests.support.clirunner import separate_stderr
from tests.support.fixtures import REPO
from tests.support.standin import KERNEL, standin_store

VERSION = "535.309.01"

# field path -> the commands whose option `flag` overrides it
FLAG_COMMANDS: dict[str, tuple[str, ...]] = {
    "driver.version": ("install",),  # and activate's VERSION argument
    "driver.flavour": ("install",),
    "driver.store": ("install",),
    "driver.registry_auth": ("install", "cloud-init"),  # cloud-init: the file to put there
    "driver.ca_file": ("install", "cloud-init"),
    "driver.insecure_http": ("install",),
    "driver.kernel": ("install", "activate"),
    "driver.modules": ("install", "activate", "rollback"),
    "driver.keep_boot_kernel": ("install",),
    "driver.branch": ("install",),
    "driver.gpus": ("install", "build-matrix"),  # and `profile check --gpus`
    "driver.branch_policy": ("install", "build-matrix"),
    "labels.cloud": ("labels",),
    "labels.mig_strategy": ("labels",),
    "cluster.api_server": ("join",),
    "cluster.token_file": ("join", "cloud-init"),
    "cluster.kubernetes_version": ("join",),
    "cluster.node_name": ("join",),
    "health.hold": ("join",),
}

# Ansible role variable -> field path. The name is the role's prefix plus the field's key, always.
ROLE_VARIABLES: dict[str, str] = {
    "nvidia_driver_version": "driver.version",
    "nvidia_driver_flavour": "driver.flavour",
    "nvidia_driver_store": "driver.store",
    "nvidia_driver_registry_auth": "driver.registry_auth",
    "nvidia_driver_ca_file": "driver.ca_file",
    "nvidia_driver_insecure_http": "driver.insecure_http",
    "nvidia_driver_kernel": "driver.kernel",
    "nvidia_driver_modules": "driver.modules",
    "nvidia_driver_keep_boot_kernel": "driver.keep_boot_kernel",
    "nvidia_driver_gpudirect": "driver.gpudirect",
    "nvidia_driver_branch": "driver.branch",
    "nvidia_driver_gpus": "driver.gpus",
    "nvidia_driver_branch_policy": "driver.branch_policy",
    "node_labels_extra": "labels.extra",
    "node_labels_cloud": "labels.cloud",
    "node_labels_mig_strategy": "labels.mig_strategy",
    "kube_join_token_file": "cluster.token_file",
}
ROLE_PREFIX = {"nvidia_driver_": "driver", "node_labels_": "labels", "kube_join_": "cluster"}
NODE_COMMANDS = ("install", "activate", "rollback", "list", "remove", "doctor")


def cli(*args: str) -> tuple[int, str, str]:
    r = separate_stderr().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def options_of(command: str) -> set[str]:
    cmd = main.commands[command]
    return {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}


def test_every_flag_in_the_table_is_an_option_of_its_commands() -> None:
    flagged = {f.path for f in FIELDS if f.flag}
    assert flagged == set(FLAG_COMMANDS), "a field's flag= and FLAG_COMMANDS disagree"
    for path, commands in FLAG_COMMANDS.items():
        flag = field_by_path(path).flag
        for command in commands:
            assert flag in options_of(command), f"{path}: {flag} is not an option of `nodeprep {command}`"


def test_node_side_commands_take_root_profile_and_json_as_the_readme_says() -> None:
    text = (REPO / "README.md").read_text()
    m = re.search(r"the node-side commands \(([^)]*)\) take `--root DIR`", text.replace("\n", " "))
    assert m, "README.md: the sentence naming the node-side commands moved"
    listed = re.findall(r"`([a-z-]+)`", m[1])
    assert set(NODE_COMMANDS) <= set(listed)
    for command in listed:
        assert {"--root", "--profile", "--json"} <= options_of(command), command


def _role_defaults() -> dict[str, object]:
    out: dict[str, object] = {}
    for f in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        out.update(yaml.safe_load(f.read_text()) or {})
    return out


def test_role_variables_map_to_fields() -> None:
    defaults = _role_defaults()
    for var, path in ROLE_VARIABLES.items():
        assert var in defaults, f"{var} is not a role variable any more"
        section, _, key = field_by_path(path).path.partition(".")
        prefix = next(p for p, s in ROLE_PREFIX.items() if s == section)
        assert var == prefix + key, f"{var}: the role spells {path} as {prefix + key}"
    for var in defaults:  # a role variable named after a field is in the table, under that field
        for prefix, section in ROLE_PREFIX.items():
            key = var.removeprefix(prefix)
            if var.startswith(prefix) and any(f.path == f"{section}.{key}" for f in FIELDS):
                assert ROLE_VARIABLES.get(var) == f"{section}.{key}", f"{var}: add it to ROLE_VARIABLES"


def test_input_errors_name_the_flag_on_the_command_line_and_the_field_elsewhere() -> None:
    e = field_error("driver.store", "/srv/store is not a directory")
    assert str(e) == "--store: /srv/store is not a directory"
    assert e.field_message() == "driver.store: /srv/store is not a directory"
    assert InputError("plain").field_message() == "plain" == str(InputError("plain"))


def _profile(root: Path, **driver: str) -> Path:
    path = root / "etc/nodeprep/node.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"driver": driver}))
    return path


def test_install_and_activate_read_the_default_profile_under_root(tmp_path: Path) -> None:
    store = standin_store(tmp_path / "work", tmp_path / "store", VERSION)
    root = tmp_path / "root"
    _profile(root, version=VERSION, store=str(store), kernel=KERNEL, flavour="proprietary")
    code, _, err = cli("install", "--root", str(root), "--no-load")
    assert code == 0, err
    assert f"installed {VERSION} for kernel {KERNEL}" in err.splitlines()
    assert (root / "opt/nvidia" / VERSION / "lib64").is_dir()
    code, _, err = cli("activate", "--root", str(root), "--no-load")
    assert code == 0, err
    assert (root / "opt/nvidia/current").readlink() == Path(VERSION)


def test_flags_override_the_profile(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    prof = _profile(tmp_path / "elsewhere", version=VERSION, store=str(tmp_path / "from-profile"))
    code, out, err = cli("install", "--root", str(root), "--profile", str(prof), "--kernel", KERNEL,
                         "--store", str(tmp_path / "from-flag"), "--check")
    assert code == 2 and out == ""
    assert err == f"error: --store: {tmp_path / 'from-flag'} is not a directory\n"
    code, _, err = cli("install", "--root", str(root), "--profile", str(prof), "--kernel", KERNEL, "--check")
    assert code == 2
    assert err == f"error: --store: {tmp_path / 'from-profile'} is not a directory\n"
    assert list(root.iterdir()) == []  # nothing written


def test_missing_settings_name_the_flag_and_the_field(tmp_path: Path) -> None:
    code, out, err = cli("install", "--root", str(tmp_path), "--store", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == "error: --driver: missing (give it or set driver.version in the profile)\n"
    code, _, err = cli("activate", "--root", str(tmp_path))
    assert code == 2
    assert err == "error: VERSION: missing (give it or set driver.version in the profile)\n"


def test_a_bad_profile_is_refused_by_every_node_command(tmp_path: Path) -> None:
    prof = _profile(tmp_path, version="55")
    for command in NODE_COMMANDS:
        args = [command, "--root", str(tmp_path), "--profile", str(prof)]
        code, _, err = cli(*args, *(["535.309.01"] if command == "remove" else []))
        assert code == 2, (command, err)
        assert err.startswith(f"error: {prof}: driver.version"), (command, err)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        pytest.param(["install", "--driver-version", "1"],
                     "error: --driver-version: no such option (did you mean --driver?)", id="unknown-option"),
        pytest.param(["install", "--flavour", "closed"],
                     "error: --flavour: 'closed' is not one of 'proprietary', 'open'.", id="bad-choice"),
        pytest.param(["verify-nodes"], "error: --kubeconfig: missing", id="missing-option"),
        pytest.param(["remove"], "error: VERSION: missing", id="missing-argument"),
        pytest.param(["--bogus"], "error: --bogus: no such option (did you mean --verbose?)",
                     id="group-option"),
        pytest.param(["instal"], "error: No such command 'instal'.", id="unknown-command"),
    ],
)
def test_click_errors_are_one_error_line(args: list[str], line: str) -> None:
    code, out, err = cli(*args)
    assert (code, out) == (2, "")
    assert err == line + "\n"


def test_profile_doc_names_each_fields_flag_and_commands() -> None:
    text = (REPO / "docs/profile.md").read_text()
    for f in FIELDS:
        m = re.search(rf"^\| `{re.escape(f.path)}` \| [^|]* \| ([^|]*) \|", text, re.M)
        assert m, f"docs/profile.md has no row for {f.path}"
        column = m[1].strip()
        if f.flag is None:
            assert column == "", f.path
        else:
            assert column.startswith(f"`{f.flag}` ("), (f.path, column)
            assert all(f"`{c}`" in column for c in FLAG_COMMANDS[f.path]), (f.path, column)


def test_cloud_init_spells_the_store_ca_as_install_does(tmp_path: Path) -> None:
    """driver.ca_file is `--ca-file` everywhere; cloud-init's older `--store-ca-file` still works,
    hidden, with one warning, and renders the same user-data."""
    prof = tmp_path / "node.yaml"
    prof.write_text(yaml.safe_dump({"driver": {"version": VERSION, "store": str(tmp_path),
                                               "ca_file": "/etc/nodeprep/store-ca.pem"}}))
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    rendered = []
    for flag in ("--ca-file", "--store-ca-file"):
        out = tmp_path / f"user-data{flag}"
        code, _, err = cli("cloud-init", "--profile", str(prof), flag, str(ca), "--out", str(out),
                           "--nodeprep-from", "index")
        assert code == 0, err
        files = {f["path"]: f for f in yaml.safe_load(out.read_text())["write_files"]}
        assert files["/etc/nodeprep/store-ca.pem"]["content"] == ca.read_text()
        rendered.append(out.read_bytes())
        assert ("warning: --store-ca-file is deprecated; use --ca-file" in err) == (flag == "--store-ca-file")
    assert rendered[0] == rendered[1]
    assert "--store-ca-file" not in main.commands["cloud-init"].get_help(click.Context(main))
