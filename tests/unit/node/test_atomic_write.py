"""nodeprep's one file writer (nodeprep.atomicfile.atomic_write): the temporary has its final mode
before the first byte, the content is fsynced before the rename and the directory after it, a link
or a FIFO at the target is replaced (never followed, never waited on), and a kill before the rename
leaves the old file."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from nodeprep import atomicfile, runner
from nodeprep.atomicfile import atomic_write, open_temp, temp_name

REPO = Path(__file__).resolve().parents[3]
MODES = (0o600, 0o640, 0o644, 0o755, 0o400)


@pytest.mark.parametrize("umask", [0, 0o022, 0o077])
@pytest.mark.parametrize("mode", MODES)
def test_the_temporary_is_created_with_its_final_mode(tmp_path: Path, mode: int, umask: int) -> None:
    old = os.umask(umask)
    try:
        fd = open_temp(tmp_path / "t", mode)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == mode  # before a single byte is written
        assert os.fstat(fd).st_size == 0
    finally:
        os.close(fd)


def test_the_temporary_is_never_an_existing_file_or_a_link(tmp_path: Path) -> None:
    (tmp_path / "host").write_text("host\n")
    (tmp_path / "link").symlink_to(tmp_path / "host")
    (tmp_path / "old").write_text("wide open\n")
    (tmp_path / "old").chmod(0o666)
    for name in ("link", "old"):
        with pytest.raises(FileExistsError):
            open_temp(tmp_path / name, 0o600)
    assert (tmp_path / "host").read_text() == "host\n"


class Fsyncs:
    """Records every fsync(2) the writer makes: (what the descriptor is, its mode, the target's
    content at that moment), then does the real fsync."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.calls: list[tuple[str, int, bytes | None]] = []
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        st = os.fstat(fd)
        what = "dir:" + os.readlink(f"/proc/self/fd/{fd}") if stat.S_ISDIR(st.st_mode) else "file"
        now = self.target.read_bytes() if self.target.is_file() else None
        self.calls.append((what, stat.S_IMODE(st.st_mode), now))
        self._real(fd)


@pytest.mark.parametrize("mode", MODES)
def test_content_is_fsynced_with_its_mode_then_the_directory_after_the_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    target = tmp_path / "etc" / "f.conf"
    target.parent.mkdir()
    target.write_text("old\n")
    spy = Fsyncs(target)
    monkeypatch.setattr(os, "fsync", spy)
    assert atomic_write(target, "new\n", mode=mode) is True
    monkeypatch.undo()
    # the file's bytes reach the disk with their final mode, before the rename publishes them
    assert spy.calls[0] == ("file", mode, b"old\n")
    # then the directory, after the rename: the new name survives a power loss
    assert spy.calls[-1] == (f"dir:{target.parent}", stat.S_IMODE(target.parent.stat().st_mode), b"new\n")
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == mode
    assert os.listdir(target.parent) == ["f.conf"]


def test_existing_file_is_replaced_not_rewritten_in_place(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("old\n")
    before = target.stat().st_ino
    with open(target, "rb") as reader:  # a reader of the old file keeps the old bytes whole
        assert atomic_write(target, "new content\n", mode=0o600) is True
        assert reader.read() == b"old\n"
    assert target.stat().st_ino != before and target.read_text() == "new content\n"
    assert atomic_write(target, "new content\n", mode=0o600) is False  # unchanged: nothing written
    assert atomic_write(target, "new content\n", mode=0o644) is True  # the mode alone differs
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("same\n")
    outside.chmod(0o644)
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").symlink_to(outside)
    assert atomic_write(d / "f", "same\n") is True  # the link's target holds these bytes: still replaced
    assert not (d / "f").is_symlink() and (d / "f").read_text() == "same\n"
    (d / "g").symlink_to(outside)
    atomic_write(d / "g", "other\n", mode=0o600)
    assert outside.read_text() == "same\n" and stat.S_IMODE(outside.stat().st_mode) == 0o644


def _write_in_child(target: Path, text: str, *, crash_at: str | None = None,
                    mode: int = 0o640) -> runner.Result:
    code = ("import sys; from pathlib import Path; from nodeprep.atomicfile import atomic_write; "
            f"atomic_write(Path(sys.argv[1]), sys.argv[2], mode={mode}, point='test:tmp')")
    env = {"NODEPREP_CRASH_AT": crash_at} if crash_at else {}
    return runner.run([sys.executable, "-c", code, target, text], check=False, timeout=30, cwd=REPO,
                      env=env, inherit_env=True)


def test_a_kill_before_the_rename_leaves_the_old_file_and_a_finished_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("old\n")
    r = _write_in_child(target, "new\n", crash_at="test:tmp")
    assert r.returncode == -9, r.stderr
    assert target.read_text() == "old\n"
    (leftover,) = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-f.")]
    assert leftover.read_text() == "new\n" and stat.S_IMODE(leftover.stat().st_mode) == 0o640
    assert atomicfile.clean_temporaries(tmp_path, (".tmp-f.",)) == [leftover]
    r = _write_in_child(target, "new\n")
    assert r.returncode == 0, r.stderr
    assert target.read_text() == "new\n" and sorted(os.listdir(tmp_path)) == ["f"]


def test_a_fifo_at_the_target_is_replaced_without_waiting_on_it(tmp_path: Path) -> None:
    """A hostile image's FIFO where a file goes: the unchanged-check never opens it for a blocking read."""
    target = tmp_path / "f"
    os.mkfifo(target)
    r = _write_in_child(target, "new\n")  # the old check read the FIFO and hung until the timeout
    assert r.returncode == 0, r.stderr
    assert target.is_file() and target.read_text() == "new\n"


def test_temporary_name_is_what_the_cleanup_removes() -> None:
    from nodeprep.node.layout import TEMP_PREFIXES

    assert temp_name(Path("/x/state.json")).name.startswith(TEMP_PREFIXES)
