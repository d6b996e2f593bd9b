"""containerd drop-in: real configurations in, merged configuration parsed back, containerd's own
parser as the judge where it is installed.

Inputs: Debian's containerd 1.6 `containerd config default` (a real version 2 config; the package
comes from scripts/deps/join.apt) and a version 3 sample written for these tests from containerd's
docs/cri/config.md ("Full configuration", containerd 2.x), with SystemdCgroup set as its "Cgroup
Driver" section shows. `containerd config dump` is run in a private mount namespace where the temp
root's /etc/containerd is bind-mounted over /etc/containerd, so the absolute imports path resolves
to the files under test (nothing on the host is touched).
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pytest

from nodeprep import runner
from nodeprep.errors import InputError
from nodeprep.profile import Cluster, Runtime
from nodeprep.runtime import containerd as ctd
from nodeprep.runtime.files import apply_changes

MAIN = "/etc/containerd/config.toml"

V3_SAMPLE = """\
# containerd 2.x configuration (version 3), after containerd docs/cri/config.md
version = 3

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    max_container_log_line_size = 16384
    enable_cdi = true
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          sandboxer = 'podsandbox'

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = ''
            SystemdCgroup = true

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dir = '/opt/cni/bin'
      conf_dir = '/etc/cni/net.d'

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
"""


@pytest.fixture(scope="module")
def debian_default() -> str:
    if runner.which("containerd") is None:
        pytest.skip("containerd is not installed (scripts/deps/join.apt)")
    return runner.run(["containerd", "config", "default"], timeout=60).stdout


def _root(tmp_path: Path, text: str | None) -> Path:
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    if text is not None:
        (root / "etc/containerd/config.toml").write_text(text)
    return root


def _apply(root: Path, runtime: Runtime | None = None, cluster: Cluster | None = None) -> list:  # type: ignore[type-arg]
    changes = ctd.plan_containerd(root, runtime or Runtime(), cluster)
    apply_changes(changes)
    return changes


def _dump(root: Path) -> dict:  # type: ignore[type-arg]
    """containerd's own merged view of the config under `root`."""
    if runner.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    script = (
        'mount --bind "$1" /etc/containerd && exec containerd --config /etc/containerd/config.toml '
        "config dump"
    )
    if not Path("/etc/containerd").is_dir():
        pytest.skip("/etc/containerd is needed as a mount point (containerd package)")
    result = runner.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", root / "etc/containerd"],
        timeout=60,
    )
    return tomllib.loads(result.stdout)


def test_debian_default_v2(tmp_path: Path, debian_default: str) -> None:
    root = _root(tmp_path, debian_default)
    before = tomllib.loads(debian_default)
    assert before["version"] == 2
    runc_opts = before["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["options"]
    changes = _apply(root)
    assert [c.target for c in changes] == [MAIN, "/etc/containerd/conf.d/99-nodeprep-nvidia.toml"]
    main_after = tomllib.loads((root / "etc/containerd/config.toml").read_text())
    assert main_after == {**before, "imports": ["/etc/containerd/conf.d/*.toml"]}  # only imports changed
    merged = ctd.merged_config(root, MAIN)
    cri = merged["plugins"]["io.containerd.grpc.v1.cri"]
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"] == {**runc_opts, "BinaryName": "/usr/bin/nvidia-container-runtime"}
    assert nvidia["options"]["SystemdCgroup"] is False  # runc's own value kept (no cluster section)
    assert cri["containerd"]["runtimes"]["runc"]["options"] == runc_opts
    assert cri["containerd"]["default_runtime_name"] == "runc"  # not asked to change it
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert cri["sandbox_image"] == before["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"]


def test_second_run_changes_nothing(tmp_path: Path, debian_default: str) -> None:
    root = _root(tmp_path, debian_default)
    _apply(root, Runtime(default_runtime=True))
    files = sorted(p for p in (root / "etc/containerd").rglob("*") if p.is_file())
    snapshot = {p: p.read_bytes() for p in files}
    again = ctd.plan_containerd(root, Runtime(default_runtime=True))
    assert [c.changed for c in again] == [False, False]
    assert apply_changes(again) == []
    assert {p: p.read_bytes() for p in files} == snapshot


def test_containerd_accepts_the_result(tmp_path: Path, debian_default: str) -> None:
    """The real check: containerd parses main + imports and shows the nvidia runtime."""
    root = _root(tmp_path, debian_default)
    _apply(root, Runtime(default_runtime=True), Cluster(api_server="10.0.0.10:6443"))
    dumped = _dump(root)
    cri = dumped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "nvidia"
    assert cri["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # cluster.cgroup_driver systemd aligns runc and copies it to nvidia
    assert cri["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert cri["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert "/etc/containerd/conf.d/99-nodeprep-nvidia.toml" in dumped["imports"]


def test_version_1_file(tmp_path: Path) -> None:
    text = (
        '# hand-written, no version line\nroot = "/var/lib/containerd"\n\n'
        '[plugins.cri.containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
        "  [plugins.cri.containerd.runtimes.runc.options]\n    SystemdCgroup = true\n"
    )
    root = _root(tmp_path, text)
    warnings: list[str] = []
    apply_changes(ctd.plan_containerd(root, Runtime(), None, warnings))
    assert "no `version` line" in warnings[0]
    main = (root / "etc/containerd/config.toml").read_text()
    assert main.startswith("# hand-written, no version line\n")  # comments kept
    drop = tomllib.loads((root / "etc/containerd/conf.d/99-nodeprep-nvidia.toml").read_text())
    assert drop["version"] == 1
    assert drop["plugins"]["cri"]["containerd"]["runtimes"]["nvidia"]["options"] == {
        "SystemdCgroup": True,
        "BinaryName": "/usr/bin/nvidia-container-runtime",
    }
    if runner.which("containerd"):
        dumped = _dump(root)
        nvidia = dumped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]
        assert nvidia["options"]["SystemdCgroup"] is True


def test_version_3_sample(tmp_path: Path) -> None:
    root = _root(tmp_path, V3_SAMPLE)
    apply_changes(ctd.plan_containerd(root, Runtime(cdi=False)))
    main = (root / "etc/containerd/config.toml").read_text()
    assert main.startswith("# containerd 2.x configuration (version 3)")
    assert main.count("imports = ") == 1 and 'imports = ["/etc/containerd/conf.d/*.toml"]' in main
    merged = ctd.merged_config(root, MAIN)
    assert merged["version"] == 3
    cri = merged["plugins"]["io.containerd.cri.v1.runtime"]
    assert "io.containerd.grpc.v1.cri" in merged["plugins"]  # other plugin tables untouched
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True}
    assert nvidia["sandboxer"] == "podsandbox"  # copied from runc
    assert ctd.nvidia_runtime_of(merged) == nvidia
    assert cri["enable_cdi"] is True  # the sample's own value, kept although cdi is off here


def test_missing_config_gets_a_v2_main(tmp_path: Path) -> None:
    root = _root(tmp_path, None)
    apply_changes(ctd.plan_containerd(root, Runtime()))
    assert (root / "etc/containerd/config.toml").read_text() == (
        'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    )
    merged = ctd.merged_config(root, MAIN)
    assert ctd.nvidia_runtime_of(merged) == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": "/usr/bin/nvidia-container-runtime"},
    }


def test_existing_imports_are_kept(tmp_path: Path) -> None:
    text = (
        'version = 2\n# our imports\nimports = [\n  "/etc/containerd/extra.toml", # site\n]\n\n'
        '[grpc]\n  address = "/x"\n'
    )
    root = _root(tmp_path, text)
    apply_changes(ctd.plan_containerd(root, Runtime()))
    main = (root / "etc/containerd/config.toml").read_text()
    assert tomllib.loads(main)["imports"] == ["/etc/containerd/extra.toml", "/etc/containerd/conf.d/*.toml"]
    assert "# our imports\n" in main and main.endswith('[grpc]\n  address = "/x"\n')


def test_nothing_asked_nothing_written(tmp_path: Path, debian_default: str) -> None:
    root = _root(tmp_path, debian_default)
    assert ctd.plan_containerd(root, Runtime(nvidia_runtime=False, cdi=False)) == []


def test_broken_config_is_input_error(tmp_path: Path) -> None:
    root = _root(tmp_path, "version = 2\n[plugins\n")
    with pytest.raises(InputError, match=r"/etc/containerd/config.toml: not valid TOML"):
        ctd.plan_containerd(root, Runtime())
    assert not (root / "etc/containerd/conf.d").exists()


def test_mode_of_main_config_is_kept(tmp_path: Path, debian_default: str) -> None:
    root = _root(tmp_path, debian_default)
    (root / "etc/containerd/config.toml").chmod(0o600)
    _apply(root)
    assert (root / "etc/containerd/config.toml").stat().st_mode & 0o777 == 0o600
    shutil.rmtree(root)


def test_containerd_version_is_probed_at_the_edge_and_judged_by_a_pure_planner() -> None:
    """The version is read once by nodeprep.join.probe (this host's real `containerd --version`, only
    for a live root with CDI) and the planner judges the text it is given: containerd before 1.7
    ignores enable_cdi."""
    from nodeprep.profile import parse_profile
    from nodeprep.runtime.plan import containerd_version, containerd_version_warnings

    cdi = parse_profile({"driver": {"version": "535.309.01"}, "runtime": {"cdi": True}})
    assert containerd_version(cdi, live=False) is None  # an image root: its containerd is not running here
    assert containerd_version_warnings(None) == []
    assert containerd_version_warnings("containerd github.com/containerd/containerd v1.7.13 7c3aca7") == []
    old = containerd_version_warnings("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1")
    assert old == ["containerd 1.6.20~ds1 ignores enable_cdi (CDI needs containerd 1.7 or newer); the nvidia "
                   "runtime still works"]
    if runner.which("containerd") is None:
        pytest.skip("containerd is not installed (scripts/deps/join.apt)")
    real = containerd_version(cdi, live=True)
    assert real is not None and "containerd" in real
    major_minor = next(w for w in real.split() if w.lstrip("v")[:1].isdigit()).lstrip("v").split(".")[:2]
    assert bool(containerd_version_warnings(real)) == (tuple(map(int, major_minor)) < (1, 7))
