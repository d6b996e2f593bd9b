"""One set of profile rules for every command that reads a profile (issue 18 §4).

`profile check`, `join`, `cloud-init`, `bootstrap` and `labels` all read the profile through
nodeprep.profile (one reader, one validation), so a profile that one of them refuses is refused by
all, with the same `error:` line. Run through the real CLI (click's CliRunner).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprep import download
from nodeprep.cli import main
from nodeprep.errors import InputError, ProfileError
from nodeprep.profile import load_profile
from nodeprep.urls import redact_url
from tests.support.clirunner import separate_stderr

REPO = Path(__file__).resolve().parents[2]
TOKEN = "k9x2mq.7f3a9c0d1e5b8a24"
CA_HASH = "sha256:" + "0f" * 32


def cli(*args: str) -> tuple[int, str, str]:
    result = separate_stderr().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr


def profile(tmp_path: Path, extra: str = "", *, token_file: str = "/etc/nodeprep/bootstrap-token") -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(
        'driver:\n  version: "550.90.07"\n  store: /srv/nodeprep-store\n'
        f'cluster:\n  api_server: "10.0.0.10:6443"\n  ca_cert_hashes: ["{CA_HASH}"]\n'
        f"  token_file: {token_file}\n" + extra
    )
    return path


def commands(prof: Path, root: Path) -> dict[str, list[str]]:
    return {
        "profile check": ["profile", "check", "--profile", str(prof), "--root", str(root)],
        "join": ["join", "--check", "--profile", str(prof), "--root", str(root)],
        "cloud-init": ["cloud-init", "--profile", str(prof), "--nodeprep-from", "index"],
        "bootstrap": ["bootstrap", "--profile", str(prof), "--root", str(root), "--check"],
        "labels": ["labels", "--profile", str(prof), "--root", str(root), "--cloud", "none",
                   "--sysfs-root", str(root / "sys")],
    }


@pytest.mark.parametrize("key", [
    "node-role.kubernetes.io/gpu",
    "node-restriction.kubernetes.io/pool",
    "kubelet.k8s.io/cpu-manager",
    "kubernetes.io/role",
])
def test_registration_only_labels_are_refused_by_every_command(tmp_path: Path, key: str) -> None:
    """Labels a kubelet may not register with (NodeRestriction) are refused where the profile is read,
    not only by `join`: a cloud node must not pass `profile check`/`cloud-init` and fail at first boot."""
    prof = profile(tmp_path, f'labels:\n  extra:\n    {key}: "gpu"\n')
    root = tmp_path / "root"
    root.mkdir()
    seen = set()
    for name, argv in commands(prof, root).items():
        code, out, err = cli(*argv)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1, (name, out, err)
        prefix = f"error: {prof}: labels.extra: cannot be set by the kubelet at registration: {key}: "
        assert errors[0].startswith(prefix), (name, errors)
        seen.add(errors[0])
    assert len(seen) == 1  # the same line from every command
    assert list(root.iterdir()) == []


def test_self_settable_extra_labels_pass(tmp_path: Path) -> None:
    prof = profile(tmp_path, 'labels:\n  extra:\n    node.kubernetes.io/pool: "gpu"\n'
                             '    example.com/rack: "r1"\n')
    assert load_profile(prof).labels.extra == {"node.kubernetes.io/pool": "gpu", "example.com/rack": "r1"}


def test_duplicate_keys_are_refused_with_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text('driver:\n  version: "550.90.07"\n\ndriver:\n  version: "535.309.01"\n')
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert e.value.problems == ["line 4: duplicate key 'driver' (first at line 1)"]
    path.write_text('driver:\n  version: "550.90.07"\nlabels:\n  extra:\n    a.io/x: "1"\n    a.io/x: "2"\n')
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert e.value.problems == ["line 6: duplicate key 'a.io/x' (first at line 5)"]


@pytest.mark.parametrize("value, kind", [("42", "an integer"), ("true", "a boolean"), ("1.5", "a number"),
                                         ("0x1F", "an integer")])
def test_label_values_are_not_coerced(tmp_path: Path, value: str, kind: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(f'driver:\n  version: "550.90.07"\nlabels:\n  extra:\n    a.io/ok: "x"\n'
                    f"    a.io/n: {value}\n")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    (problem,) = e.value.problems
    assert problem.startswith("labels.extra: 'a.io/n': ")
    assert f"must be a quoted string (YAML read it as {kind}" in problem
    assert problem.endswith("(line 6)")


def test_problem_lines_point_into_lists(tmp_path: Path) -> None:
    path = profile(tmp_path, "  taints:\n    - a=b:NoSchedule\n    - c:Never\n")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert e.value.problems == [
        "cluster.taints[1]: taint effect 'Never' is not one of NoSchedule, PreferNoSchedule, NoExecute "
        "(line 10)"]


def test_duplicate_taints_are_refused(tmp_path: Path) -> None:
    path = profile(tmp_path, "  taints: [a=b:NoSchedule, 'a=c:NoSchedule', a:NoExecute]\n")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert e.value.problems == [
        "cluster.taints[1]: a:NoSchedule is already set by [0] (one taint per key and effect) (line 8)"]


def test_cloud_init_refuses_a_readable_token_file_like_join(tmp_path: Path) -> None:
    """One token-file check: a group/other-readable file is refused by `cloud-init --token-file`
    exactly as `join` refuses it as cluster.token_file."""
    token = tmp_path / "root" / "etc" / "nodeprep" / "bootstrap-token"
    token.parent.mkdir(parents=True)
    token.write_text(TOKEN + "\n")
    token.chmod(0o644)
    prof = profile(tmp_path)
    code, out, err = cli("cloud-init", "--profile", str(prof), "--nodeprep-from", "index",
                         "--token-file", str(token))
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == (f"error: --token-file: {token} has mode 0644; the bootstrap token "
                                   "must not be readable by group or others")
    assert TOKEN not in err
    code, out, err = cli("join", "--check", "--profile", str(prof), "--root", str(tmp_path / "root"))
    assert code == 2
    assert err.splitlines()[0] == ("error: cluster.token_file: /etc/nodeprep/bootstrap-token has mode "
                                   "0644; the bootstrap token must not be readable by group or others")
    token.chmod(0o600)
    code, out, err = cli("cloud-init", "--profile", str(prof), "--nodeprep-from", "index",
                         "--token-file", str(token))
    assert code == 0, err
    assert TOKEN in out  # written into the user-data (as a 0600 file on the node), never into runcmd


def test_token_symlink_leaving_root_is_read_inside_it(tmp_path: Path) -> None:
    """The link resolves beneath --root as on the booted node (issue #25): the host's file is not read."""
    root = tmp_path / "root"
    (root / "etc" / "nodeprep").mkdir(parents=True)
    outside = tmp_path / "outside-token"
    outside.write_text(TOKEN + "\n")
    outside.chmod(0o600)
    (root / "etc" / "nodeprep" / "bootstrap-token").symlink_to(outside)
    code, out, err = cli("join", "--check", "--profile", str(profile(tmp_path)), "--root", str(root))
    assert code == 2
    assert err.startswith("error: cluster.token_file: /etc/nodeprep/bootstrap-token does not exist")
    assert TOKEN not in out + err


def test_store_credentials_are_refused_and_never_shown(tmp_path: Path) -> None:
    url = "https://admin:s3cr3t@store.example.com/nodeprep"
    prof = tmp_path / "node.yaml"
    prof.write_text(f'driver:\n  version: "550.90.07"\n  store: "{url}"\n')
    (tmp_path / "root").mkdir()
    for argv in (["profile", "check", "--profile", str(prof)],
                 ["install", "--root", str(tmp_path / "root"), "--store", url, "--driver", "550.90.07",
                  "--kernel", "6.1.0-28-amd64"]):
        code, out, err = cli(*argv)
        assert code == 2, (argv, err)
        assert "s3cr3t" not in out + err and "admin" not in out + err
        assert "https://<redacted>@store.example.com/nodeprep" in err and "credentials" in err
    assert list((tmp_path / "root").iterdir()) == []


def test_urls_are_redacted_in_download_errors() -> None:
    assert redact_url("see http://u:p@h:1/x and https://tok@h/y") == (
        "see http://<redacted>@h:1/x and https://<redacted>@h/y")
    with pytest.raises(InputError) as e:  # refused before connecting, redacted in the refusal
        download.fetch_bytes("http://user:pw-secret@127.0.0.1:9/index.json")
    assert "pw-secret" not in str(e.value) and "<redacted>@127.0.0.1:9" in str(e.value)


# --- the module structure behind "one validation" -----------------------------------------------------

def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included), made absolute."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_no_import_cycle_between_profile_and_labels() -> None:
    """The label rules both need live below both (nodeprep.labelrules); the profile never reaches into
    nodeprep.labels, not even inside a function."""
    profile_imports = set().union(*(_imports(p) for p in (REPO / "nodeprep" / "profile").glob("*.py")))
    assert not any(m.startswith("nodeprep.labels.") or m == "nodeprep.labels" for m in profile_imports)
    assert "nodeprep.labelrules" in profile_imports
    rules = _imports(REPO / "nodeprep" / "labelrules.py")
    assert not any(m.startswith("nodeprep.") and m != "nodeprep.__future__" for m in rules), rules
    code = ("import sys, nodeprep.profile; "
            "assert not [m for m in sys.modules if m.startswith('nodeprep.labels')], sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
