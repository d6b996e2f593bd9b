"""`install --activate --root R` never writes outside R through the image's own links (issue #25):
ROOT/opt, ROOT/etc/systemd, ROOT/var/lib/nodeprep, ROOT/lib, ROOT/lib/firmware, ROOT/etc/kernel,
ROOT/etc/ld.so.conf.d and ROOT/etc/modprobe.d as absolute links to a
directory outside the root, or as `../` links that climb out of it lexically. Each resolves inside
the root as it does on the booted node (openat2 RESOLVE_IN_ROOT): the install succeeds, writes
there, and the outside directory is byte-identical afterwards. A lock that is a link is refused
(exit 2, one `error:` line) with nothing changed.

Artifacts are real (tests/support/standin.py); the real CLI runs, with real ldconfig and depmod.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from nodeprep.cli import main
from nodeprep.node.state import load_state
from tests.support.standin import KERNEL, standin_store, tree

V = "535.309.01"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("confined")
    return standin_store(work / "work", work / "store", V)


def install(store: Path, root: Path):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["install", "--store", str(store), "--driver", V, "--kernel", KERNEL,
                                     "--root", str(root), "--activate", "--node-store", str(store),
                                     "--json"])


def _outside(tmp_path: Path) -> Path:
    """A host directory the links point at, with content that must not change."""
    out = tmp_path / "outside"
    for d in ("opt", "systemd/system", "state", "lib/modules", "kernel/postinst.d", "ld.so.conf.d",
              "modprobe.d", "firmware/nvidia"):
        (out / d).mkdir(parents=True)
        (out / d / "keep").write_text(f"host's {d}\n")
    (out / "hostfile").write_text("host data\n")
    return out


# link in the image -> (target kind, outside name, file expected under the link's resolved place)
CASES = {
    "opt": ("opt", f"nvidia/{V}/manifest.json"),
    "etc/systemd": ("systemd", "system/nodeprep-nvidia.service"),
    "var/lib/nodeprep": ("state", "state.json"),
    "lib": ("lib", f"modules/{KERNEL}/modules.dep"),  # depmod wrote it there
    "etc/kernel": ("kernel", "postinst.d/nodeprep"),
    "etc/ld.so.conf.d": ("ld.so.conf.d", "00-nvidia.conf"),
    "etc/modprobe.d": ("modprobe.d", "nodeprep-nvidia.conf"),
    "lib/firmware": ("firmware", f"nvidia/{V}"),
}


@pytest.mark.parametrize("how", ["absolute", "relative"])
@pytest.mark.parametrize("link", sorted(CASES))
def test_image_links_resolve_inside_the_root(store: Path, tmp_path: Path, link: str, how: str) -> None:
    out = _outside(tmp_path)
    root = tmp_path / "root"
    name, expected = CASES[link]
    where = root / (link.rsplit("/", 1)[0] if "/" in link else "")
    where.mkdir(parents=True, exist_ok=True)
    if how == "absolute":
        text, inside = str(out / name), root / str(out / name).lstrip("/")
    else:  # exactly enough `..` to reach tmp_path lexically: on the host it names out/<name>
        text, inside = "../" * link.count("/") + "../outside/" + name, root / "outside" / name
    (root / link).symlink_to(text)
    assert (root / link).resolve() == out / name  # followed on the host, it leaves the root
    before = tree(out)

    result = install(store, root)
    assert result.exit_code == 0, result.output
    assert tree(out) == before
    assert (inside / expected).exists() or (inside / expected).is_symlink(), sorted(tree(root))
    state = load_state(root)
    assert state.active == V and state.installed[V].kernels == (KERNEL,)
    again = install(store, root)  # the second run finds what the first wrote
    assert again.exit_code == 0, again.output
    assert '"changed": false' in again.stdout
    assert tree(out) == before


@pytest.mark.parametrize("target", ["outside-file", "dangling", "inside-file"])
def test_a_linked_lock_is_refused(store: Path, tmp_path: Path, target: str) -> None:
    out = _outside(tmp_path)
    root = tmp_path / "root"
    (root / "var/lib/nodeprep").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/hostname").write_text("node\n")
    text = {"outside-file": str(out / "hostfile"), "dangling": str(out / "missing"),
            "inside-file": "/etc/hostname"}[target]
    (root / "var/lib/nodeprep/lock").symlink_to(text)
    before, before_root = tree(out), tree(root)

    result = install(store, root)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert lines == ["error: /var/lib/nodeprep/lock is not a regular file: not nodeprep's lock"], lines
    assert "Traceback" not in result.output
    assert tree(out) == before and (out / "hostfile").read_text() == "host data\n"
    assert tree(root) == before_root and (root / "var/lib/nodeprep/lock").is_symlink()
    assert not (out / "missing").exists() and (root / "etc/hostname").read_text() == "node\n"


@pytest.mark.parametrize("image", ["loop", "file"])
def test_unresolvable_links_are_refused(store: Path, tmp_path: Path, image: str) -> None:
    """A link loop (ROOT/opt -> /opt) or a file where a directory should be: exit 2, one `error:`
    line naming the path, nothing written."""
    root = tmp_path / "root"
    root.mkdir()
    if image == "loop":
        (root / "opt").symlink_to("/opt")
        want = "error: /opt/nvidia under --root " + str(root) + ": Too many levels of symbolic links at /opt"
    else:
        (root / "srv").write_text("not a directory\n")
        (root / "opt").symlink_to("/srv/opt")
        want = "error: /opt/nvidia under --root " + str(root) + ": Not a directory at /srv"
    before = tree(tmp_path)
    result = install(store, root)
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.startswith("error: ")] == [want]
    assert "Traceback" not in result.output
    assert tree(tmp_path) == before


def test_atomic_write_never_writes_through_links(tmp_path: Path) -> None:
    """A link in place of the file, or named like its temporary, is replaced, never written through."""
    import os

    from nodeprep.atomicfile import atomic_write

    host = tmp_path / "host"
    host.write_text("host\n")
    d = tmp_path / "d"
    d.mkdir()
    (d / f".tmp-f.{os.getpid()}").symlink_to(host)
    (d / "f").symlink_to(host)
    assert atomic_write(d / "f", "host\n") is True  # same bytes as the link's target: still replaced
    assert host.read_text() == "host\n" and not (d / "f").is_symlink() and (d / "f").read_text() == "host\n"
    assert os.listdir(d) == ["f"]
