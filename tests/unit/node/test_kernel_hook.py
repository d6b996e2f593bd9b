"""The kernel hook without apt: the GRUB default it computes, the script it writes (run by a real
/bin/sh), and `nodeprep kernel-hook` on a node root laid out as `install` leaves it (files written
here; tests/slow/node/test_kernel_hook.py installs real kernel packages with apt)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.node import kernelevents, kernelhook
from nodeprep.node.layout import Layout
from nodeprep.node.state import load_state

V = "535.309.01"
K_OLD, K_NEW = "6.1.0-56-amd64", "6.1.0-57-amd64"
UUID = "0b1d2c3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e"
# The shape grub-mkconfig's 10_linux writes on Debian 12 (ids and titles; classes and bodies shortened).
D = "Debian GNU/Linux"
ID = "$menuentry_id_option"
GRUB_CFG = f"""\
### BEGIN /etc/grub.d/10_linux ###
menuentry '{D}' --class debian {ID} 'gnulinux-simple-{UUID}' {{
	linux	/boot/vmlinuz-{K_NEW} root=UUID={UUID} ro quiet
}}
submenu 'Advanced options for {D}' {ID} 'gnulinux-advanced-{UUID}' {{
	menuentry '{D}, with Linux {K_NEW}' --class debian {ID} 'gnulinux-{K_NEW}-advanced-{UUID}' {{
		linux	/boot/vmlinuz-{K_NEW} root=UUID={UUID} ro quiet
	}}
	menuentry '{D}, with Linux {K_OLD} (recovery mode)' {ID} 'gnulinux-{K_OLD}-recovery-{UUID}' {{
		linux	/boot/vmlinuz-{K_OLD} root=UUID={UUID} ro single
	}}
	menuentry '{D}, with Linux {K_OLD}' --class debian {ID} 'gnulinux-{K_OLD}-advanced-{UUID}' {{
		linux	/boot/vmlinuz-{K_OLD} root=UUID={UUID} ro quiet
	}}
}}
### END /etc/grub.d/10_linux ###
"""


def test_grub_default_by_ids_inside_the_submenu() -> None:
    want = f"gnulinux-advanced-{UUID}>gnulinux-{K_OLD}-advanced-{UUID}"
    assert kernelevents.grub_default(GRUB_CFG, K_OLD) == want


def test_grub_default_without_submenu_and_without_grub_cfg() -> None:
    flat = "\n".join(
        ln.lstrip("\t") for ln in GRUB_CFG.splitlines() if not ln.startswith(("submenu", "}"))
    )
    assert kernelevents.grub_default(flat, K_OLD) == f"gnulinux-{K_OLD}-advanced-{UUID}"
    assert kernelevents.grub_default(None, K_OLD) == (
        f"Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {K_OLD}")


def _run_hook(
    tmp_path: Path, command: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "hook"
    script.write_text(kernelhook.render_hook(command, "postinst"))
    script.chmod(0o755)
    return subprocess.run([script, K_NEW, f"/boot/vmlinuz-{K_NEW}"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=30)


def test_hook_script_never_fails_the_package(tmp_path: Path) -> None:
    failing = tmp_path / "nodeprep-fails"
    failing.write_text('#!/bin/sh\necho "called: $*" >&2\nexit 1\n')
    failing.chmod(0o755)
    r = _run_hook(tmp_path, str(failing))
    assert (r.returncode, r.stdout) == (0, "")  # output goes to stderr (kernel handbook 8.1)
    assert r.stderr == f"called: kernel-hook postinst {K_NEW} /boot/vmlinuz-{K_NEW}\n"
    r = _run_hook(tmp_path, "/nonexistent/nodeprep")
    assert (r.returncode, r.stdout) == (0, "")
    assert r.stderr == f"{kernelhook.LOUD} {K_NEW}: /nonexistent/nodeprep is not installed\n"
    r = _run_hook(tmp_path, str(failing), {"DEB_MAINT_PARAMS": "'abort-configure'"})
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def node_root(tmp_path: Path, *, store: str, keep: bool) -> Path:
    """A root as `install` leaves it (V active with modules for K_OLD, whose image is in /boot) in
    which the kernel package K_NEW was just unpacked."""
    root = tmp_path / "root"
    kdir = root / "opt/nvidia" / V / "modules" / K_OLD
    kdir.mkdir(parents=True)
    (root / "opt/nvidia" / V / "manifest.json").write_text('{"input_digest": "x"}')
    (kdir / "manifest.json").write_text('{"flavour": "proprietary"}')
    (root / "opt/nvidia/current").symlink_to(V)
    for k in (K_OLD, K_NEW):
        (root / "lib/modules" / k / "kernel").mkdir(parents=True)
    (root / "boot").mkdir()
    (root / "boot" / f"vmlinuz-{K_OLD}").touch()
    (root / "var/lib/nodeprep").mkdir(parents=True)
    (root / "var/lib/nodeprep/state.json").write_text(json.dumps(
        {"kernel_hook": {"store": store, "keep_boot_kernel": keep}}))
    return root


def test_missing_store_is_one_loud_line_and_keeps_the_boot_default(tmp_path: Path) -> None:
    root = node_root(tmp_path, store="/srv/no-store", keep=True)
    (root / "boot/grub").mkdir()
    (root / "boot/grub/grub.cfg").write_text(GRUB_CFG)
    r = CliRunner().invoke(main, ["kernel-hook", "postinst", K_NEW, "--root", str(root)])
    assert r.exit_code == 1
    assert r.output.splitlines() == [
        f"{kernelhook.LOUD} {K_NEW}: --store: /srv/no-store is not a directory; it boots WITHOUT the GPU "
        f"driver (boot default kept on {K_OLD} (/{kernelhook.HOLD_FILE}), but GRUB is not installed here)"]
    hold = (root / kernelhook.HOLD_FILE).read_text()
    assert hold.endswith(f"GRUB_DEFAULT='gnulinux-advanced-{UUID}>gnulinux-{K_OLD}-advanced-{UUID}'\n")
    # the file is shell that grub-mkconfig sources: it must give GRUB_DEFAULT back exactly
    out = subprocess.run(["sh", "-c", f'. "{root / kernelhook.HOLD_FILE}"; printf %s "$GRUB_DEFAULT"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == f"gnulinux-advanced-{UUID}>gnulinux-{K_OLD}-advanced-{UUID}"


def test_without_the_setting_only_the_line(tmp_path: Path) -> None:
    root = node_root(tmp_path, store="/srv/no-store", keep=False)
    r = CliRunner().invoke(main, ["kernel-hook", "postinst", K_NEW, "--root", str(root), "--json"])
    assert r.exit_code == 1
    out = json.loads(r.output)
    assert out["ok"] is False and out["boot_hold"] is None
    assert out["message"].endswith(f"(set driver.keep_boot_kernel to keep booting {K_OLD})")
    assert not (root / "etc/default").exists()


@pytest.mark.parametrize(("kernel", "line"), [
    ("6.1.0-999-amd64", "error: kernel 6.1.0-999-amd64: not installed under ROOT (no "
     "/lib/modules/6.1.0-999-amd64/kernel); the hook takes the release of an installed kernel"),
    ("../x", "error: --kernel: '../x' is not a kernel release (e.g. 6.1.0-28-amd64)"),
])
def test_bad_kernel_argument(tmp_path: Path, kernel: str, line: str) -> None:
    root = node_root(tmp_path, store="/srv/no-store", keep=True)
    r = CliRunner().invoke(main, ["kernel-hook", "postinst", kernel, "--root", str(root)])
    assert r.exit_code == 2
    assert r.output.splitlines() == [line.replace("ROOT", str(root))]
    assert not (root / "etc").exists()


def test_nothing_recorded_nothing_to_do(tmp_path: Path) -> None:
    root = node_root(tmp_path, store="/srv/no-store", keep=True)
    (root / "var/lib/nodeprep/state.json").write_text("{}")
    r = CliRunner().invoke(main, ["kernel-hook", "postinst", K_NEW, "--root", str(root)])
    assert (r.exit_code, r.output) == (0, "nodeprep kernel hook: no store recorded by nodeprep install; "
                                          "nothing to do\n")


def test_postrm_removes_the_modules_of_a_removed_kernel_only(tmp_path: Path) -> None:
    root = node_root(tmp_path, store="/srv/store", keep=False)
    layout = Layout(root)
    gone = layout.kmod_dir(V, K_NEW)
    gone.mkdir()
    (gone / "manifest.json").write_text('{"flavour": "proprietary"}')
    (gone / "nvidia.ko").write_bytes(b"\x7fELF")
    links = layout.module_links(K_NEW)
    links.mkdir(parents=True)
    (links / "nvidia.ko").symlink_to(f"../../../../../opt/nvidia/current/modules/{K_NEW}/nvidia.ko")
    r = CliRunner().invoke(main, ["kernel-hook", "postrm", K_NEW, "--root", str(root)])
    assert (r.exit_code, r.output) == (0, f"nodeprep kernel hook: kernel {K_NEW} is still installed; "
                                          "its NVIDIA modules stay\n")
    assert gone.is_dir()
    (root / "lib/modules" / K_NEW / "kernel").rmdir()  # what dpkg leaves of a removed kernel
    r = CliRunner().invoke(main, ["kernel-hook", "postrm", K_NEW, "--root", str(root), "--json"])
    assert r.exit_code == 0
    assert json.loads(r.output)["removed"] == [f"/lib/modules/{K_NEW}/updates/nodeprep",
                                               f"/opt/nvidia/{V}/modules/{K_NEW}"]
    assert not gone.exists() and not links.exists()
    assert load_state(root).installed[V].kernels == (K_OLD,)


def test_install_records_node_paths(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "root")
    assert kernelhook.node_view(layout, str(tmp_path / "root/srv/store")) == "/srv/store"
    assert kernelhook.node_view(layout, f"file://{tmp_path}/root/srv/store") == "/srv/store"
    assert kernelhook.node_view(layout, "/srv/elsewhere") == "/srv/elsewhere"
    assert kernelhook.node_view(layout, "oci://reg.example/gpu/drivers") == "oci://reg.example/gpu/drivers"
    assert kernelhook.node_view(layout, "https://h.example/s") == "https://h.example/s"
    assert os.path.basename(kernelhook.hook_path(layout, "postinst")) == "nodeprep"


def test_the_boot_default_stays_kept_while_an_installed_kernel_lacks_modules(tmp_path: Path) -> None:
    root = node_root(tmp_path, store="/srv/no-store", keep=True)
    (root / "boot" / f"vmlinuz-{K_NEW}").touch()
    assert CliRunner().invoke(main, ["kernel-hook", "postinst", K_NEW, "--root", str(root)]).exit_code == 1
    hold = root / kernelhook.HOLD_FILE
    assert hold.is_file()
    r = CliRunner().invoke(main, ["kernel-hook", "postinst", K_OLD, "--root", str(root), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["boot_hold"] is None
    assert hold.is_file()  # K_NEW, the newest kernel, still has no modules
    (root / "boot" / f"vmlinuz-{K_NEW}").unlink()  # K_NEW removed
    (root / "lib/modules" / K_NEW / "kernel").rmdir()
    r = CliRunner().invoke(main, ["kernel-hook", "postinst", K_OLD, "--root", str(root), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["boot_hold"] == f"/{kernelhook.HOLD_FILE}"
    assert not hold.exists()
