"""`build-driver --runfile URL --sha256 HEX`: real makeself installers (Debian's makeself) served by
a loopback HTTP server this test starts (the one stand-in: NVIDIA's download server).

- the real Debian driver tree repacked as NVIDIA-Linux-x86_64-<ver>.run: its kernel/ tree is
  byte-identical to Debian's, so the modules compiled for the shared real build are reused through
  the compile cache (no second full compile in CI; `compiled` is false and the modules' bytes equal
  the Debian-built ones);
- a tiny module tree: a real kbuild compile in the real build root (seconds), Ctrl-C mid-build,
  a compiler error, a wrong checksum, an unreachable server.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from nodeprep import artifact, runner
from tests.support.httpdir import serve_directory
from tests.support.makeself import make_runfile

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodeprep.cli", *args]


def cli(*args: str, timeout: float = 1800):
    return runner.run(cli_argv(*args), check=False, timeout=timeout, cwd=REPO, env={"PYTHONPATH": str(REPO)})


@pytest.fixture
def http_dir(tmp_path):
    """Serve tmp_path/www on 127.0.0.1 (ephemeral port); yields (directory, base URL)."""
    www = tmp_path / "www"
    www.mkdir()
    with serve_directory(www) as base:
        yield www, base


TINY_MAKEFILE = """\
# NVIDIA-style top-level Makefile for a one-file module (kbuild does the work).
KERNEL_UNAME ?= $(shell uname -r)
modules:
\t$(SLOW)
\t$(MAKE) -C /lib/modules/$(KERNEL_UNAME)/build M=$(CURDIR) modules
"""
TINY_C = """\
#include <linux/module.h>
#include <linux/init.h>
static int __init nv_init(void) { return INIT_RESULT; }
static void __exit nv_exit(void) { }
module_init(nv_init);
module_exit(nv_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION("%s");
%s
"""


def tiny_runfile(
    root: Path, version: str = "535.309.01", *, broken: bool = False, slow: bool = False, init: int = 0
) -> Path:
    pkg = root / f"NVIDIA-Linux-x86_64-{version}"
    kernel = pkg / "kernel"
    (kernel / "nvidia").mkdir(parents=True)
    (kernel / "Makefile").write_text(TINY_MAKEFILE.replace("$(SLOW)", "sleep 60" if slow else "true"))
    (kernel / "Kbuild").write_text("obj-m := nvidia.o\nnvidia-y := nvidia/nv.o\n")
    (kernel / "nvidia" / "nv.c").write_text(
        (TINY_C % (version, "int broken(void) { return nope; }" if broken else "")).replace(
            "INIT_RESULT", str(init)
        )
    )
    return make_runfile(pkg, root / f"NVIDIA-Linux-x86_64-{version}.run", compression="gzip")


def build_args(real_build, store: Path, url: str, sha: str, *extra: str) -> list[str]:
    return [
        "build-driver",
        "--runfile",
        url,
        "--sha256",
        sha,
        "--kernel",
        real_build.kernel_release,
        "--store",
        str(store),
        "--cache",
        str(real_build.cache),
        "--no-userspace",
        "--no-smoke-test",
        *extra,
    ]


def leftovers(cache: Path) -> list[str]:
    tmp = cache / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []


def test_real_driver_tree_as_runfile_reuses_the_compiled_modules(real_build, http_dir, tmp_path):
    www, base = http_dir
    src = tmp_path / "deb"
    debs = json.loads(artifact.read_manifest(real_build.kmod).to_json())["inputs"]
    source_deb = next(real_build.cache / "debs" / n for n in debs if n.startswith("nvidia-kernel-source_"))
    runner.run(["dpkg-deb", "-x", source_deb, src])
    tarball = next((src / "usr" / "src").glob("nvidia-kernel*.tar.xz"))
    runner.run(["tar", "-xJf", tarball, "-C", src])
    pkg = tmp_path / f"NVIDIA-Linux-x86_64-{real_build.driver_version}"
    pkg.mkdir()
    os.rename(src / "modules" / "nvidia-kernel", pkg / "kernel")
    run = make_runfile(
        pkg, www / f"NVIDIA-Linux-x86_64-{real_build.driver_version}.run", compression="gzip", level=1
    )  # fast to pack; xz etc. are covered in the unit tier
    sha = artifact.sha256_file(run)
    store = tmp_path / "store"
    res = cli(*build_args(real_build, store, f"{base}/{run.name}", sha, "--json"))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["compiled"] is False and summary["cached"] is False  # new artifact, reused compile
    assert summary["driver_version"] == real_build.driver_version
    built = store / summary["name"]
    m = artifact.read_manifest(built)
    assert m.inputs[run.name] == sha and m.extra["source"]["kind"] == "runfile"
    assert not any(n.startswith("nvidia-kernel-source_") for n in m.inputs)
    ref = artifact.read_manifest(real_build.kmod)
    assert {k: v.sha256 for k, v in m.files.items()} == {k: v.sha256 for k, v in ref.files.items()}
    assert m.input_digest != ref.input_digest
    assert leftovers(real_build.cache) == []


def test_real_runfile_publishes_its_own_user_space_which_installs_and_passes_doctor(
    real_build, http_dir, tmp_path
):
    """An installer made of REAL files (Debian's driver tree as kernel/, the real user space of the
    shared build laid out as NVIDIA's installers are, with its .manifest; tests/support/makeself.py),
    served by the loopback stand-in of NVIDIA's download server: build-driver publishes the kmod
    (the shared build's compile reused, nothing compiled) and the user space made from the
    installer's own files, which has the Debian-built one's layout and installs with the kmod into
    a test root where doctor's user-space checks pass."""
    from click.testing import CliRunner

    from nodeprep.cli import main
    from tests.support.makeself import nvidia_tree

    www, base = http_dir
    before = leftovers(real_build.cache)  # the shared cache: another session's build may be running
    version = real_build.driver_version
    debian_us = tmp_path / "debian-us"
    debian_us.mkdir()
    artifact.extract(real_build.userspace, debian_us)
    pkg = nvidia_tree(debian_us, tmp_path / f"NVIDIA-Linux-x86_64-{version}", version)
    src = tmp_path / "deb"
    debs = json.loads(artifact.read_manifest(real_build.kmod).to_json())["inputs"]
    source_deb = next(real_build.cache / "debs" / n for n in debs if n.startswith("nvidia-kernel-source_"))
    runner.run(["dpkg-deb", "-x", source_deb, src])
    runner.run(["tar", "-xJf", next((src / "usr" / "src").glob("nvidia-kernel*.tar.xz")), "-C", src])
    os.rename(src / "modules" / "nvidia-kernel", pkg / "kernel")
    run = make_runfile(pkg, www / f"NVIDIA-Linux-x86_64-{version}.run", compression="gzip", level=1,
                       label=f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}")
    sha = artifact.sha256_file(run)
    store = tmp_path / "store"
    res = cli(*[a for a in build_args(real_build, store, f"{base}/{run.name}", sha, "--json")
                if a != "--no-userspace"])
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["compiled"] is False and summary["userspace"]
    us = artifact.read_manifest(Path(summary["userspace"]))
    assert us.inputs == {run.name: sha} and us.extra["source"]["kind"] == "runfile"
    assert us.files == artifact.read_manifest(real_build.userspace).files
    root = tmp_path / "root"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    done = CliRunner().invoke(main, ["install", "--store", str(store), "--driver", version, "--kernel",
                                     real_build.kernel_release, "--root", str(root), "--activate"])
    assert done.exit_code == 0, done.output
    doctor = CliRunner().invoke(main, ["doctor", "--root", str(root), "--json", "--check", "state", "--check",
                                       "ldcache", "--check", "support"])
    checks = json.loads(doctor.stdout)["checks"]
    assert all(c["ok"] and not c.get("skipped") for c in checks), checks
    assert [n for n in leftovers(real_build.cache) if n not in before] == []


def test_tiny_runfile_compiles_strips_and_publishes(real_build, http_dir, tmp_path):
    www, base = http_dir
    run = tiny_runfile(www, "999.01.01")
    sha = artifact.sha256_file(run)
    store = tmp_path / "store"
    res = cli(
        *build_args(real_build, store, f"{base}/{run.name}", sha, "--json", "--rebuild")
    )  # compile even if an earlier run cached it
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["compiled"] is True and summary["modules"] == ["nvidia.ko"]
    assert summary["vermagic"].startswith(real_build.kernel_release + " ")
    out = tmp_path / "x"
    out.mkdir()
    artifact.extract(store / summary["name"], out)
    ko = out / "modules" / real_build.kernel_release / "nvidia.ko"
    assert runner.run(["modinfo", "-F", "version", ko]).stdout.strip() == "999.01.01"
    assert ".debug_info" not in runner.run(["objdump", "-h", ko]).stdout
    log_text = Path(summary["log"]).read_text()
    assert "CC [M]  /build/kernel/nvidia/nv.o" in log_text  # built at the fixed path
    first = artifact.sha256_file(store / summary["name"])
    # Same inputs again: a store hit. Forced: compiled again, and still the same bytes.
    again = json.loads(cli(*build_args(real_build, store, f"{base}/{run.name}", sha, "--json")).stdout)
    assert again["cached"] is True and again["sha256"] == first
    forced = cli(*build_args(real_build, store, f"{base}/{run.name}", sha, "--json", "--rebuild"))
    assert forced.returncode == 0, forced.stderr[-2000:]
    forced_summary = json.loads(forced.stdout)
    assert forced_summary["compiled"] is True and forced_summary["sha256"] == first
    assert leftovers(real_build.cache) == []


def test_progress_on_a_terminal(real_build, http_dir, tmp_path):
    """On a terminal (script(1) gives the command a pty) compile progress is shown."""
    www, base = http_dir
    run = tiny_runfile(www, "999.01.02")
    argv = cli_argv(
        *build_args(
            real_build, tmp_path / "store", f"{base}/{run.name}", artifact.sha256_file(run), "--rebuild"
        )
    )
    import shlex

    res = runner.run(
        ["script", "-qec", shlex.join(argv), "/dev/null"],
        check=False,
        timeout=900,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "TERM": "dumb"},
    )
    assert res.returncode == 0, res.stdout[-2000:]
    assert "downloading" in res.stdout and "compiling 2/2 objects" in res.stdout


def test_compile_error_shows_compiler_lines_and_log(real_build, http_dir, tmp_path):
    www, base = http_dir
    run = tiny_runfile(www, "999.01.03", broken=True)
    store = tmp_path / "store"
    res = cli(*build_args(real_build, store, f"{base}/{run.name}", artifact.sha256_file(run)))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    err = next(ln for ln in lines if ln.startswith("error: "))
    assert err.startswith("error: compiling the modules failed (make exit 2); full log: ")
    log_path = Path(err.rsplit("full log: ", 1)[1])
    assert "'nope' undeclared" in log_path.read_text()
    assert any("'nope' undeclared" in ln for ln in lines[lines.index(err) + 1 :])
    assert not store.exists() or not list(store.glob("*.tar.zst"))
    assert leftovers(real_build.cache) == []


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_interrupt_mid_build_leaves_nothing_behind(real_build, http_dir, tmp_path):
    www, base = http_dir
    run = tiny_runfile(www, "999.01.04", slow=True)
    store = tmp_path / "store"
    import subprocess  # noqa: PLC0415 - the test drives a real Ctrl-C, which runner.run cannot

    proc = subprocess.Popen(
        cli_argv(*build_args(real_build, store, f"{base}/{run.name}", artifact.sha256_file(run))),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
        # A suite run as a background job inherits an ignored SIGINT (the shell's doing) and so
        # would the build: the child gets the default disposition a terminal's Ctrl-C meets.
        preexec_fn=_default_sigint,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("==> Compiling"):
            break
    time.sleep(3)
    assert any(p.name.startswith("build.") for p in (real_build.cache / "tmp").iterdir())
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    assert "error: interrupted" in rest
    assert leftovers(real_build.cache) == []
    assert not store.exists() or not list(store.glob("*.tar.zst"))


def test_wrong_checksum_and_unreachable_server(real_build, http_dir, tmp_path):
    www, base = http_dir
    run = tiny_runfile(www, "999.01.05")
    res = cli(*build_args(real_build, tmp_path / "s", f"{base}/{run.name}", "0" * 64))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: {base}/{run.name}: sha256 {artifact.sha256_file(run)} does not match the expected {'0' * 64}"
    )
    res = cli(
        *build_args(real_build, tmp_path / "s", "http://127.0.0.1:9/NVIDIA-Linux-x86_64-1.run", "0" * 64),
        timeout=300,
    )
    assert res.returncode == 1
    assert "127.0.0.1:9" in res.stderr.strip().splitlines()[-1] and "failed after" in res.stderr
    assert not (tmp_path / "s").exists()


def test_tiny_module_signed_with_a_generated_key(real_build, http_dir, tmp_path):
    """--sign-key/--sign-cert go through nodeprep.builder.signing after strip: modinfo shows the
    signer, the manifest records it, and the store's module carries the appended signature."""
    www, base = http_dir
    run = tiny_runfile(www, "999.01.06")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    runner.run(
        [
            "openssl",
            "req",
            "-new",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "30",
            "-subj",
            "/CN=nodeprep build test/",
            "-keyout",
            key,
            "-outform",
            "PEM",
            "-out",
            cert,
            "-addext",
            "extendedKeyUsage=codeSigning",
        ],
        timeout=120,
    )
    store = tmp_path / "store"
    res = cli(
        *build_args(
            real_build,
            store,
            f"{base}/{run.name}",
            artifact.sha256_file(run),
            "--json",
            "--sign-key",
            str(key),
            "--sign-cert",
            str(cert),
        )
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["signed"] is True
    m = artifact.read_manifest(store / summary["name"])
    assert m.extra["signing"]["modules"] and m.extra["signing"]["hash"] == "sha256"
    out = tmp_path / "x"
    out.mkdir()
    artifact.extract(store / summary["name"], out)
    ko = out / "modules" / real_build.kernel_release / "nvidia.ko"
    assert ko.read_bytes().endswith(b"~Module signature appended~\n")
    assert runner.run(["modinfo", "-F", "signer", ko]).stdout.strip() == "nodeprep build test"


def test_smoke_test_gates_publishing(real_build, http_dir, tmp_path):
    """--smoke-test boots the target kernel in qemu (nodeprep.builder.smoke) after sign/strip and
    before pack: a module whose init fails (-ENODEV) is not published; one that loads is, with the
    verdict in its manifest."""
    if not runner.which("qemu-system-x86_64"):
        pytest.fail("qemu-system-x86_64 is not installed (the smoke test's scripts/deps list it)")
    www, base = http_dir
    store = tmp_path / "store"
    (www / "bad").mkdir()
    bad = tiny_runfile(www / "bad", "999.01.07", init=-19)
    res = cli(
        *[
            a
            for a in build_args(real_build, store, f"{base}/bad/{bad.name}", artifact.sha256_file(bad))
            if a != "--no-smoke-test"
        ],
        "--smoke-test",
    )
    assert res.returncode == 1, res.stderr[-2000:]
    err = next(ln for ln in res.stderr.splitlines() if ln.startswith("error: "))
    assert err.startswith(f"error: smoke test failed on {real_build.kernel_release}: ")
    assert err.endswith("not publishing (--no-smoke-test skips it)")
    assert not list(store.glob("nvidia-kmod-999.01.07-*"))
    good = tiny_runfile(www, "999.01.08")
    res = cli(
        *[
            a
            for a in build_args(real_build, store, f"{base}/{good.name}", artifact.sha256_file(good))
            if a != "--no-smoke-test"
        ],
        "--smoke-test",
        "--json",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    assert summary["smoke_test"] == "PASS"
    assert artifact.read_manifest(store / summary["name"]).extra["smoke_test"]["verdict"] == "PASS"


def test_progress_lines_in_a_log(real_build, http_dir, tmp_path):
    """Output to a pipe (CI logs, Ansible, cloud-init's log): make stays silent for 60 s (the tiny
    Makefile sleeps first, as NVIDIA's conftest keeps `CC [M]` lines away for minutes) and the log
    still gets a progress line with the objects counted so far; the summary names the next steps."""
    www, base = http_dir
    run = tiny_runfile(www, "999.01.05", slow=True)
    sha = artifact.sha256_file(run)
    res = cli(*build_args(real_build, tmp_path / "store", f"{base}/{run.name}", sha, "--rebuild"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "compile: compiling 0/2 objects (0%)" in res.stderr, res.stderr
    assert "\r" not in res.stderr  # no terminal line rewriting in a log
    assert "next steps:" in res.stderr and "nodeprep smoke-test " in res.stderr
