"""Images built with `--root` must not point back at the machine that built them (#28): a missing
root is refused by every node command, and the kernel hook's recorded store is what the booted node
will reach. Real CLI, a store of small real artifacts (tests/support/standin.py), temporary roots."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from nodeprep.cli import main
from nodeprep.node.state import load_state
from tests.support.clirunner import separate_stderr
from tests.support.standin import KERNEL, standin_store

V_OLD, V_NEW = "535.216.03", "535.309.01"
STORE_A, STORE_B = "http://127.0.0.1:9/drivers-a", "http://127.0.0.1:9/drivers-b"  # recorded, never fetched


def cli(*args: str) -> tuple[int, str, str]:
    r = separate_stderr().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def _root_commands(group: click.Group = main, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            found += _root_commands(cmd, (*prefix, name))
        elif any(p.name == "root" for p in cmd.params):
            found.append((*prefix, name))
    return found


ROOT_COMMANDS = _root_commands()


def test_the_node_commands_all_take_root() -> None:
    names = {" ".join(c) for c in ROOT_COMMANDS}
    assert {"install", "activate", "rollback", "remove", "list", "doctor", "runtime", "join",
            "bootstrap", "labels"} <= names, sorted(names)


@pytest.mark.parametrize("command", ROOT_COMMANDS, ids=" ".join)
def test_a_missing_root_is_refused_and_not_created(command: tuple[str, ...], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-image"
    code, out, err = cli(*command, "--root", str(missing))
    assert code == 2, (out, err)
    assert err.splitlines()[0] == f"error: --root {missing}: does not exist"
    assert "Traceback" not in err and not missing.exists() and list(tmp_path.iterdir()) == []


def test_a_file_as_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "image.img").write_bytes(b"")
    code, _, err = cli("rollback", "--root", str(tmp_path / "image.img"))
    assert code == 2 and err.splitlines()[0] == f"error: --root {tmp_path / 'image.img'}: is not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.img"]


def _install(root: Path, store: Path, version: str, *extra: str) -> str:
    code, _, err = cli("install", "--store", str(store), "--driver", version, "--kernel", KERNEL,
                       "--root", str(root), "--no-load", *extra)
    assert code == 0, err
    return err


def test_a_build_machine_directory_is_not_recorded_for_the_image(tmp_path: Path) -> None:
    store = standin_store(tmp_path / "work", tmp_path / "store", V_NEW)
    root = tmp_path / "root"
    root.mkdir()
    err = _install(root, store, V_NEW, "--activate")
    assert f"kernel hook: the store {store} is a directory of this machine" in err
    assert "--node-store" in err
    assert load_state(root).kernel_hook is None
    assert not (root / "etc/kernel/postinst.d/nodeprep").exists()


def test_a_relative_store_is_not_recorded_for_the_image(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    standin_store(tmp_path / "work", tmp_path / "store", V_NEW)
    (tmp_path / "root").mkdir()
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("install", "--store", "store", "--driver", V_NEW, "--kernel", KERNEL, "--root", "root",
                       "--no-load", "--activate")
    assert code == 0, err
    # the command line's relative store is its cwd's directory, named so
    assert f"kernel hook: the store {tmp_path / 'store'} is a directory of this machine" in err
    state = json.loads((tmp_path / "root/var/lib/nodeprep/state.json").read_text())
    assert state.get("kernel_hook") is None


def test_a_store_inside_the_image_is_recorded_as_the_node_sees_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = standin_store(tmp_path / "work", root / "srv/drivers", V_NEW)
    err = _install(root, store, V_NEW, "--activate")
    assert "is not recorded" not in err
    assert load_state(root).kernel_hook["store"] == "/srv/drivers"  # type: ignore[index]
    assert (root / "etc/kernel/postinst.d/nodeprep").is_file()
    # the image has no nodeprep for the hooks to call: the install says so
    said = [ln for ln in err.splitlines() if "has no `nodeprep` on its PATH" in ln]
    assert len(said) == 1 and said[0].startswith("warning: the image "), err  # once, not per writer
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/bin/nodeprep").write_text("#!/bin/sh\n")
    (root / "usr/bin/nodeprep").chmod(0o755)
    err = _install(root, store, V_NEW, "--activate")
    assert "/usr/bin/nodeprep runs /bin/sh, which it does not have" in err
    (root / "bin").mkdir()
    (root / "bin/sh").write_text("")
    assert "warning:" not in _install(root, store, V_NEW, "--activate")


def test_node_store_is_recorded_and_kept_for_the_active_version(tmp_path: Path) -> None:
    store_old = standin_store(tmp_path / "work-old", tmp_path / "store-old", V_OLD)
    store_new = standin_store(tmp_path / "work-new", tmp_path / "store-new", V_NEW)
    root = tmp_path / "root"
    root.mkdir()
    _install(root, store_old, V_OLD, "--activate", "--node-store", STORE_A)
    assert load_state(root).kernel_hook["store"] == STORE_A  # type: ignore[index]
    assert (root / "etc/kernel/postinst.d/nodeprep").is_file()
    # a second version from another store, not activated: the active version's store stays recorded
    _install(root, store_new, V_NEW, "--node-store", STORE_B)
    state = load_state(root)
    assert state.active == V_OLD and state.kernel_hook["store"] == STORE_A  # type: ignore[index]
    # activated, its store is the one the hook needs
    _install(root, store_new, V_NEW, "--activate", "--node-store", STORE_B)
    state = load_state(root)
    assert state.active == V_NEW and state.kernel_hook["store"] == STORE_B  # type: ignore[index]
