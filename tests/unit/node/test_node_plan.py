"""The install plan (nodeprep.node.driverplan) against roots prepared by real installs: what it says would
change is what the install then changes, and a root it calls done is one the install leaves alone.
`install --check` prints that plan and writes nothing.

Artifacts are real (tests/support/standin.py): user spaces of real shared objects, kmods whose
nvidia.ko is an object with a real .modinfo; only the library contents stand in for NVIDIA's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nodeprep.errors import InputError
from nodeprep.node import installer
from nodeprep.node.driverplan import plan_activate, plan_remove
from nodeprep.node.state import load_state
from tests.support.clirunner import invoke
from tests.support.standin import KERNEL, standin_store, tree

V = "535.309.01"
K2 = "6.12.48+deb12-amd64"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("plan")
    return standin_store(work / "work", work / "store", V, (KERNEL, K2))


def install(store: Path, root: Path, kernel: str = KERNEL, *extra: str):  # type: ignore[no-untyped-def]
    return invoke("install", "--store", str(store), "--driver", V, "--kernel", kernel, "--root", str(root),
                  "--activate", "--node-store", str(store), *extra)


def test_fresh_root_plan_then_install(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    before, todo = installer.plan(root, str(store), V, kernel=KERNEL, activate=True, node_store=str(store))
    assert before.installed == {} and todo.changes and todo.new_version
    assert todo.kmod is not None and todo.kmod.kernel_release == KERNEL
    assert todo.activation is not None and todo.activation.switch and todo.activation.active is None
    assert "/etc/ld.so.conf.d/00-nvidia.conf" in todo.activation.drift
    assert todo.after(before).active == V and todo.after(before).installed[V].kernels == (KERNEL,)
    assert todo.kernel_hook is not None and not todo.kernel_hook.recorded
    assert todo.kernel_hook.write == ("/etc/kernel/postinst.d/nodeprep", "/etc/kernel/postrm.d/nodeprep")
    assert todo.after(before).kernel_hook == todo.kernel_hook.record

    snapshot = tree(tmp_path)
    shown = install(store, root, KERNEL, "--check")
    assert shown.exit_code == 0, shown.output
    assert f"would install {V} for kernel {KERNEL}" in shown.output
    assert f"would activate {V} (active now: none)" in shown.output
    assert "would write the kernel hook /etc/kernel/postinst.d/nodeprep" in shown.output
    as_json = json.loads(install(store, root, KERNEL, "--check", "--json").stdout)
    assert as_json["changes"] is True and as_json["install_kmod"] == todo.kmod.name
    assert tree(tmp_path) == snapshot  # --check wrote nothing, not even the lock

    done = install(store, root, KERNEL, "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["changed"] is True
    after = load_state(root)
    assert (after.active, after.installed[V].kernels) == (V, (KERNEL,))
    _, again = installer.plan(root, str(tmp_path / "no-store"), V, kernel=KERNEL, activate=True,
                        node_store=str(tmp_path / "no-store"))
    assert again.userspace is None  # the store was not even read
    assert again.kernel_hook is not None and again.kernel_hook.write == ()  # the hooks are in place,
    assert again.changes and not again.kernel_hook.recorded  # only the recorded store would change
    _, again = installer.plan(root, str(tmp_path / "no-store"), V, kernel=KERNEL, activate=True,
                              kernel_hook=False)
    assert not again.changes
    _, same = installer.plan(root, str(store), V, kernel=KERNEL, activate=True, node_store=str(store))
    assert not same.changes and same.kernel_hook is not None and same.kernel_hook.recorded
    written = {p: p.stat().st_mtime_ns for p in (root / "etc/kernel/postinst.d/nodeprep",
                                                root / "etc/kernel/postrm.d/nodeprep",
                                                root / "var/lib/nodeprep/state.json")}
    rerun = install(store, root, KERNEL, "--json")
    assert rerun.exit_code == 0 and json.loads(rerun.stdout)["changed"] is False, rerun.output
    assert {p: p.stat().st_mtime_ns for p in written} == written  # a re-run with no change wrote nothing
    shown = install(store, root, KERNEL, "--check")
    assert "nothing to do" in shown.output and f"{V} is already active" in shown.output


def test_another_kernel_and_repair_are_planned(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    assert install(store, root).exit_code == 0
    _, todo = installer.plan(root, str(store), V, kernel=K2, activate=True)
    assert todo.changes and not todo.new_version and todo.kmod is not None
    assert todo.kmod.kernel_release == K2 and todo.activation is not None and not todo.activation.switch
    result = json.loads(install(store, root, K2, "--json").stdout)
    assert result["installed_kmod"] and not result["installed_userspace"]
    assert load_state(root).installed[V].kernels == tuple(sorted((KERNEL, K2)))
    assert not installer.plan(root, str(store), V, kernel=K2, activate=True)[1].changes

    ld_conf = root / "etc/ld.so.conf.d/00-nvidia.conf"
    ld_conf.write_text("/somewhere/else\n")  # drift: activation would rewrite it
    _, todo = installer.plan(root, str(store), V, kernel=K2, activate=True)
    assert todo.changes and todo.activation is not None
    assert todo.activation.drift == ("/etc/ld.so.conf.d/00-nvidia.conf",)
    assert "would rewrite /etc/ld.so.conf.d/00-nvidia.conf" in install(store, root, K2, "--check").output
    assert json.loads(install(store, root, K2, "--json").stdout)["changed"] is True
    assert ld_conf.read_text() == "/opt/nvidia/current/lib64\n"
    assert not installer.plan(root, str(store), V, kernel=K2, activate=True)[1].changes
    assert not installer.plan(root, str(store), V, kernel=K2)[1].changes  # no activation: files not looked at


def test_plans_refuse_what_apply_refuses(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    assert install(store, root).exit_code == 0
    state = load_state(root)
    with pytest.raises(InputError, match="not installed"):
        plan_activate(state, "550.54.14")
    with pytest.raises(InputError, match=f"no kernel modules for kernel {re.escape(K2)}"):
        plan_activate(state, V, kernel=K2)
    with pytest.raises(InputError, match="is the active driver"):
        plan_remove(state, V)
    assert not plan_remove(state, "550.54.14").remove
    with pytest.raises(InputError, match="no user-space artifact for 550.54.14"):
        installer.plan(root, str(store), "550.54.14", kernel=KERNEL)
    result = invoke("install", "--store", str(store), "--driver", V, "--kernel", "6.1.0-99-amd64",
                    "--root", str(root), "--check")
    assert result.exit_code == 2 and "vermagic mismatch" in result.output
