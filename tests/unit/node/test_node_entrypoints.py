"""Stable entry points (nodeprep/node/entrypoints.py) made by the real CLI in a test root: links on
the paths NVIDIA's discovery searches, through /opt/nvidia/current, following activate, switch and
rollback; another package's file is never replaced. The consumers themselves (validator, nvidia-ctk,
GFD, device plugin) run against such roots in tests/slow/node/test_node_nvidia_stack.py.

Artifacts are real (tests/support/standin.py); only the library contents stand in for NVIDIA's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeprep import artifact
from nodeprep.errors import StateFileError
from nodeprep.node.state import load_state
from tests.support import rawartifact as ra
from tests.support.clirunner import invoke
from tests.support.standin import KERNEL, standin_kmod, tree, userspace_artifact

V1, V2 = "535.216.03", "535.309.01"
TOOLS = ("nvidia-smi", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
LIBS = ("libnvidia-ml.so.1", "libcuda.so.1")
LIBDIR = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory store with user space and a stand-in kmod of V1 and V2."""
    work = tmp_path_factory.mktemp("entry")
    store = work / "store"
    store.mkdir()
    found = []
    for v in (V1, V2):
        us = userspace_artifact(work / f"us-{v}", v, store)
        found += [(us, artifact.read_manifest(us)), standin_kmod(work / f"ko-{v}", v, store)]
    return ra.store_with(store, found)


def install(store: Path, root: Path, version: str, *extra: str):  # type: ignore[no-untyped-def]
    return invoke("install", "--store", str(store), "--driver", version, "--kernel", KERNEL, "--root",
                  str(root), *extra)


def resolved(root: Path, node_path: str) -> str:
    """Where `node_path` leads inside the root, relative to it (the links must resolve in-root)."""
    return os.path.relpath(os.path.realpath(root / node_path.lstrip("/")), root)


def entry_points(root: Path) -> dict[str, str]:
    paths = [f"/usr/bin/{t}" for t in TOOLS] + [f"/{LIBDIR}/{lib}" for lib in LIBS]
    return {p: resolved(root, p) for p in paths}


def test_links_follow_activate_switch_rollback(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / LIBDIR).mkdir(parents=True)
    assert install(store, root, V2).exit_code == 0
    assert not (root / "usr/bin/nvidia-smi").exists()  # installed, not active: no entry point yet

    done = install(store, root, V1, "--activate")
    assert done.exit_code == 0, done.output
    want = {f"/usr/bin/{t}": f"opt/nvidia/{V1}/bin/{t}" for t in TOOLS}
    want.update({f"/{LIBDIR}/libnvidia-ml.so.1": f"opt/nvidia/{V1}/lib64/libnvidia-ml.so.{V1}",
                 f"/{LIBDIR}/libcuda.so.1": f"opt/nvidia/{V1}/lib64/libcuda.so.{V1}"})
    assert entry_points(root) == want
    assert os.readlink(root / "usr/bin/nvidia-smi") == "../../opt/nvidia/current/bin/nvidia-smi"
    assert os.readlink(root / LIBDIR / "libnvidia-ml.so.1") == (
        "../../../opt/nvidia/current/lib64/libnvidia-ml.so.1")
    assert sorted(load_state(root).entry_points) == sorted(want)
    links = {p: os.readlink(root / p.lstrip("/")) for p in want}

    assert invoke("activate", V2, "--root", str(root)).exit_code == 0
    assert entry_points(root) == {p: t.replace(V1, V2) for p, t in want.items()}
    assert {p: os.readlink(root / p.lstrip("/")) for p in want} == links  # moved by `current` alone
    assert invoke("rollback", "--root", str(root)).exit_code == 0
    assert entry_points(root) == want

    again = invoke("activate", V1, "--root", str(root), "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["changed"] is False

    (root / "usr/bin/nvidia-smi").unlink()  # the plan (install --check) sees what activation would redo
    shown = install(store, root, V1, "--activate", "--check", "--json")
    assert json.loads(shown.stdout)["activation"]["rewrite"] == ["/usr/bin/nvidia-smi"], shown.output
    assert install(store, root, V1, "--activate").exit_code == 0
    assert resolved(root, "/usr/bin/nvidia-smi") == f"opt/nvidia/{V1}/bin/nvidia-smi"
    shown = install(store, root, V1, "--activate", "--check", "--json")
    assert json.loads(shown.stdout)["activation"]["rewrite"] == []


def test_another_packages_nvidia_smi_is_never_replaced(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_bytes(b"\x7fELF distribution's nvidia-smi")
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (info / "nvidia-smi:amd64.list").write_text("/.\n/usr\n/usr/bin\n/usr/bin/nvidia-smi\n")
    assert install(store, root, V1).exit_code == 0
    before = tree(root)

    refused = invoke("activate", V1, "--root", str(root))
    assert refused.exit_code == 2, refused.output
    errors = [line for line in refused.output.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: /usr/bin/nvidia-smi belongs to package nvidia-smi (dpkg): nodeprep does not "
                      f"replace another package's file; {V1} not activated"], refused.output
    assert "Traceback" not in refused.output
    assert tree(root) == before  # nothing changed: not current, not ld.so.conf.d, not the state
    assert load_state(root).active is None

    fresh = tmp_path / "fresh"  # install --activate: refused before the version is even installed
    (fresh / "usr/bin").mkdir(parents=True)
    (fresh / "usr/bin/nvidia-smi").write_bytes(b"x")
    (fresh / "var/lib/dpkg/info").mkdir(parents=True)
    (fresh / "var/lib/dpkg/info/nvidia-smi:amd64.list").write_text("/usr/bin/nvidia-smi\n")
    before = tree(fresh)
    at_once = install(store, fresh, V1, "--activate")
    assert at_once.exit_code == 2 and "belongs to package nvidia-smi (dpkg)" in at_once.output
    assert tree(fresh) == before

    listed_in_lib = tmp_path / "merged"  # merged /usr: dpkg lists /bin/nvidia-smi for the same file
    (listed_in_lib / "usr/bin").mkdir(parents=True)
    (listed_in_lib / "usr/bin/nvidia-smi").write_bytes(b"x")
    (listed_in_lib / "var/lib/dpkg/info").mkdir(parents=True)
    (listed_in_lib / "var/lib/dpkg/info/nvidia-smi.list").write_text("/bin/nvidia-smi\n")
    assert install(store, listed_in_lib, V1).exit_code == 0
    merged = invoke("activate", V1, "--root", str(listed_in_lib))
    assert merged.exit_code == 2 and "belongs to package nvidia-smi (dpkg)" in merged.output


def test_a_file_nodeprep_did_not_make_is_refused_until_moved(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / LIBDIR).mkdir(parents=True)
    foreign = root / LIBDIR / "libnvidia-ml.so.1"
    foreign.symlink_to("libnvidia-ml.so.470.256.02")  # a runfile install's link, no package owns it
    refused = install(store, root, V1, "--activate")
    assert refused.exit_code == 2
    assert f"/{LIBDIR}/libnvidia-ml.so.1 exists and nodeprep did not make it" in refused.output
    assert os.readlink(foreign) == "libnvidia-ml.so.470.256.02" and load_state(root).installed == {}

    foreign.unlink()
    assert install(store, root, V1, "--activate").exit_code == 0
    assert resolved(root, f"/{LIBDIR}/libnvidia-ml.so.1") == f"opt/nvidia/{V1}/lib64/libnvidia-ml.so.{V1}"


def test_a_root_with_only_usr_lib64_gets_the_library_there(store: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib64").mkdir(parents=True)  # a RHEL-shaped root: no /usr/lib/<triplet>
    assert install(store, root, V1, "--activate").exit_code == 0
    assert resolved(root, "/usr/lib64/libnvidia-ml.so.1") == f"opt/nvidia/{V1}/lib64/libnvidia-ml.so.{V1}"
    assert not (root / LIBDIR).exists()


def test_hostile_recorded_entry_points_are_refused(store: Path, tmp_path: Path) -> None:
    """state.json naming paths outside /usr (or with ..) never makes nodeprep touch them: the state
    file is refused (one error line naming the field, exit 2, issue #25)."""
    root = tmp_path / "root"
    victim = root / "etc/passwd"
    victim.parent.mkdir(parents=True)
    victim.write_text("root:x:0:0::/root:/bin/sh\n")
    assert install(store, root, V2).exit_code == 0
    assert install(store, root, V1, "--activate").exit_code == 0
    state_file = root / "var/lib/nodeprep/state.json"
    data = json.loads(state_file.read_text())
    good = len(data["entry_points"])
    for hostile in ("/etc/passwd", "/usr/../etc/passwd", 7):
        state_file.write_text(json.dumps({**data, "entry_points": [*data["entry_points"], hostile]}))
        with pytest.raises(StateFileError, match=rf"entry_points\[{good}\]"):
            load_state(root)
        r = invoke("activate", V2, "--root", str(root))
        assert r.exit_code == 2 and f"entry_points[{good}]" in r.output, r.output
        assert victim.read_text() == "root:x:0:0::/root:/bin/sh\n"


def test_doctor_takes_the_library_entry_point_for_the_active_version(store: Path, tmp_path: Path) -> None:
    """With Debian's ld.so.conf the cache lists libnvidia-ml.so.1 twice (current/lib64 first, then the
    entry point); both are the active file, so doctor names no other copy."""
    root = tmp_path / "root"
    (root / LIBDIR).mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    assert install(store, root, V1, "--activate").exit_code == 0
    done = invoke("doctor", "--root", str(root), "--check", "ldcache", "--json")
    (check,) = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "ldcache"]
    assert check["ok"], check
    assert f"libnvidia-ml.so.1 -> /opt/nvidia/{V1}/lib64/libnvidia-ml.so.{V1}" in check["message"]
    assert "also in cache" not in check["message"]
