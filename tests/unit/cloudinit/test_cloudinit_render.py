"""`nodeprep cloud-init`: the rendered user-data parsed back, validated with Debian's real
`cloud-init schema -c`, and (MIME) merged by cloud-init's own part handler.

cloud-init comes from scripts/deps/cloud.apt (Debian package; /usr/bin/cloud-init runs on the
distribution's /usr/bin/python3). Nothing here talks to a network or a metadata service.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import string
from pathlib import Path

import pytest
import yaml

from nodeprep import __version__, cloudinit, runner
from nodeprep.cli import main
from nodeprep.digests import sha256_file
from tests.support.clirunner import separate_stderr

HERE = Path(__file__).resolve().parent
TOKEN = "abcdef.0123456789abcdef"
HASH = "sha256:" + "0f3bda1bf4b1b4a7c3e0b9a1c5d5e3f8f1a2b3c4d5e6f708192a3b4c5d6e7f80"


def cloud_init() -> str:
    tool = runner.which("cloud-init")
    if tool is None:
        pytest.fail("cloud-init is not installed: run scripts/setup.sh (scripts/deps/cloud.apt)")
    return tool


def schema_check(path: Path) -> str:
    """Run the real `cloud-init schema -c`; return its output (raises CommandError when invalid)."""
    return runner.run([cloud_init(), "schema", "-c", path]).stdout


def profile_file(tmp_path: Path, *, store: str | None = None, extra: dict[str, str] | None = None,
                 cluster: bool = True) -> Path:
    data: dict = {"driver": {"version": "535.309.01", "store": store or str(tmp_path / "store")},
                  "labels": {"extra": extra or {"example.com/team": "ml-platform"}}}
    if cluster:
        data["cluster"] = {"api_server": "10.0.0.10:6443", "token_file": "/etc/nodeprep/bootstrap-token",
                           "ca_cert_hashes": [HASH]}
    path = tmp_path / "node.yaml"
    path.write_text("# test profile\n" + yaml.safe_dump(data, sort_keys=False))
    return path


def fake_wheel(store: Path) -> Path:
    """A file named like the published wheel: only its name and sha256 enter the user-data."""
    wheel = store / "tools" / cloudinit.wheel_name()
    wheel.parent.mkdir(parents=True, exist_ok=True)
    wheel.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    return wheel


def render_cli(*args: str) -> tuple[int, str, str]:
    result = separate_stderr().invoke(main, ["cloud-init", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def test_plain_cloud_config_is_valid_and_complete(tmp_path: Path, token_file: Path) -> None:
    store = tmp_path / "store"
    wheel = fake_wheel(store)
    profile = profile_file(tmp_path)
    out = tmp_path / "user-data"
    code, _, err = render_cli("--profile", str(profile), "--token-file", str(token_file), "--out", str(out))
    assert code == 0, err
    assert "Valid cloud-config" in schema_check(out)
    raw = out.read_text()
    assert raw.startswith("#cloud-config\n")
    assert out.stat().st_mode & 0o777 == 0o600  # it holds the token
    cfg = yaml.safe_load(raw)
    files = cloudinit.decoded_files(cfg)
    assert files["/etc/nodeprep/node.yaml"]["content"] == profile.read_text()
    tok = files["/etc/nodeprep/bootstrap-token"]
    assert (tok["content"], tok["permissions"], tok["owner"]) == (TOKEN + "\n", "0600", "root:root")
    assert files["/etc/nodeprep/ca-cert-hashes"]["content"] == HASH + "\n"
    assert files[cloudinit.INSTALLER_PATH]["content"] == cloudinit.installer()
    assert files[cloudinit.INSTALLER_PATH]["permissions"] == "0755"
    assert cfg["runcmd"] == [
        [cloudinit.INSTALLER_PATH, "python3", "store", f"{store}/tools/{wheel.name}", sha256_file(wheel)],
        ["/usr/local/bin/nodeprep", "bootstrap", "--profile", "/etc/nodeprep/node.yaml"],
        ["systemctl", "enable", "nodeprep-bootstrap.service"],
    ]
    unit = files["/etc/systemd/system/nodeprep-bootstrap.service"]["content"]
    assert "ExecStart=/usr/local/bin/nodeprep bootstrap --profile /etc/nodeprep/node.yaml\n" in unit
    assert "RestartPreventExitStatus=2\n" in unit and TOKEN not in unit
    # store mode installs the wheel without dependencies: the distribution provides them
    assert {"python3-venv", "python3-click", "python3-yaml", "python3-zstandard"} <= set(cfg["packages"])
    # the token is a file, never an argument
    assert TOKEN not in json.dumps(cfg["runcmd"])
    assert raw.count(TOKEN) == 1


def test_index_mode_and_rhel_family(tmp_path: Path) -> None:
    profile = profile_file(tmp_path, store="https://artifacts.example.com/nvidia", cluster=False)
    out = tmp_path / "user-data"
    code, _, err = render_cli("--profile", str(profile), "--nodeprep-from", "index", "--os-family", "rhel",
                              "--out", str(out))
    assert code == 0, err
    schema_check(out)
    cfg = yaml.safe_load(out.read_text())
    assert cfg["runcmd"][0] == [cloudinit.INSTALLER_PATH, "python3.11", "index", f"nodeprep=={__version__}"]
    assert "python3.11" in cfg["packages"] and "python3-click" not in cfg["packages"]
    assert "/etc/nodeprep/bootstrap-token" not in cloudinit.decoded_files(cfg)


def test_rhel_store_mode_is_refused(tmp_path: Path) -> None:
    fake_wheel(tmp_path / "store")
    code, out, err = render_cli("--profile", str(profile_file(tmp_path)), "--os-family", "rhel")
    assert code == 2 and out == ""
    assert err.strip() == ("error: --os-family rhel: nodeprep's dependencies are not packaged for its "
                           "python; use --nodeprep-from index")


def test_remote_store_needs_the_wheel_for_its_sha256(tmp_path: Path) -> None:
    profile = profile_file(tmp_path, store="https://artifacts.example.com/nvidia")
    code, out, err = render_cli("--profile", str(profile))
    assert code == 2 and out == ""
    assert err.startswith("error: driver.store 'https://artifacts.example.com/nvidia' is remote: pass "
                          "--nodeprep-wheel FILE")
    wheel = fake_wheel(tmp_path / "local")
    code, out, err = render_cli("--profile", str(profile), "--nodeprep-wheel", str(wheel))
    assert code == 0, err
    cfg = yaml.safe_load(out)
    assert cfg["runcmd"][0][3:] == [f"https://artifacts.example.com/nvidia/tools/{wheel.name}",
                                    sha256_file(wheel)]


def test_publish_wheel_copies_into_the_store(tmp_path: Path) -> None:
    profile = profile_file(tmp_path)
    built = fake_wheel(tmp_path / "dist")
    code, out, err = render_cli("--profile", str(profile), "--publish-wheel", str(built))
    assert code == 0, err
    published = tmp_path / "store" / "tools" / built.name
    assert published.read_bytes() == built.read_bytes()
    assert yaml.safe_load(out)["runcmd"][0][4] == sha256_file(built)


@pytest.mark.parametrize("content, message", [
    ("not-a-token\n", "not a bootstrap token"),
    ("ABCDEF.0123456789abcdef\n", "not a bootstrap token"),
])
def test_bad_token_is_one_line_exit_2(tmp_path: Path, content: str, message: str) -> None:
    fake_wheel(tmp_path / "store")
    bad = tmp_path / "tok"
    bad.write_text(content)
    bad.chmod(0o600)
    code, out, err = render_cli("--profile", str(profile_file(tmp_path)), "--token-file", str(bad))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: --token-file: {bad}: {message} (expected [a-z0-9]{{6}}.[a-z0-9]{{16}}")
    assert content.strip() not in err


def test_token_without_cluster_and_bad_ca_hash(tmp_path: Path, token_file: Path) -> None:
    fake_wheel(tmp_path / "store")
    profile = profile_file(tmp_path, cluster=False)
    code, _, err = render_cli("--profile", str(profile), "--token-file", str(token_file))
    assert code == 2 and "has no cluster section" in err
    code, _, err = render_cli("--profile", str(profile_file(tmp_path)), "--ca-cert-hash", "sha256:abc")
    assert code == 2 and err.strip() == "error: --ca-cert-hash: 'sha256:abc' is not sha256:<64 hex digits>"


def test_invalid_profile_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("driver:\n  version: 535\n")
    code, out, err = render_cli("--profile", str(bad))
    assert code == 2 and out == "" and "Traceback" not in err
    assert "driver.version" in err


def test_extra_ca_hash_goes_into_the_profile(tmp_path: Path) -> None:
    fake_wheel(tmp_path / "store")
    other = "sha256:" + "ab" * 32
    code, out, err = render_cli("--profile", str(profile_file(tmp_path)), "--ca-cert-hash", other)
    assert code == 0, err
    files = cloudinit.decoded_files(yaml.safe_load(out))
    node = yaml.safe_load(files["/etc/nodeprep/node.yaml"]["content"])
    assert node["cluster"]["ca_cert_hashes"] == [HASH, other]
    assert files["/etc/nodeprep/ca-cert-hashes"]["content"] == f"{HASH}\n{other}\n"


def _labels(n: int, *, random_values: bool, seed: int = 1) -> dict[str, str]:
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    out = {}
    for i in range(n):
        value = "".join(rnd.choice(alphabet) for _ in range(60)) if random_values else f"value-{i % 7}"
        out[f"example.com/label-{i:04d}"] = value
    return out


def test_large_profile_switches_to_gz_b64_files(tmp_path: Path) -> None:
    fake_wheel(tmp_path / "store")
    profile = profile_file(tmp_path, extra=_labels(600, random_values=False))
    assert profile.stat().st_size > cloudinit.AWS_USER_DATA_LIMIT
    out = tmp_path / "user-data"
    code, stdout, err = render_cli("--profile", str(profile), "--out", str(out), "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["format"] == "cloud-config+gz+b64" and summary["size"] == out.stat().st_size
    assert summary["token"] is False and summary["nodeprep_from"] == "store"
    code, stdout, err = render_cli("--profile", str(profile), "--json")
    assert code == 2 and stdout == ""
    assert err.strip() == "error: --json prints a summary only: pass --out FILE for the user-data"
    assert "Valid cloud-config" in schema_check(out)
    assert out.stat().st_size <= cloudinit.AWS_USER_DATA_LIMIT
    cfg = yaml.safe_load(out.read_text())
    raw_files = {f["path"]: f for f in cfg["write_files"]}
    assert raw_files["/etc/nodeprep/node.yaml"]["encoding"] == "gz+b64"
    assert cloudinit.decoded_files(cfg)["/etc/nodeprep/node.yaml"]["content"] == profile.read_text()


def test_whole_gzip_then_clear_error(tmp_path: Path) -> None:
    """Random label values barely compress: 16 KB of them must fail with one clear line."""
    fake_wheel(tmp_path / "store")
    profile = profile_file(tmp_path, extra=_labels(400, random_values=True))
    code, out, err = render_cli("--profile", str(profile))
    assert code == 2 and out == ""
    first = err.splitlines()[0]
    assert first.startswith("error: user-data does not fit in 16384 bytes even compressed (cloud-config: ")
    assert "cloud-config+gz+b64+gzip: " in first
    assert "largest file: /etc/nodeprep/node.yaml" in err
    # a cloud that allows more takes it, and the user-data stays valid once decompressed
    out_file = tmp_path / "user-data"
    code, _, err = render_cli("--profile", str(profile), "--limit", "65535", "--out", str(out_file))
    assert code == 0, err
    schema_check(out_file)


def test_render_prefers_smallest_change(tmp_path: Path) -> None:
    """Library level: plain when it fits; gzip of the whole user-data only when gz+b64 files do not."""
    spec = cloudinit.UserDataSpec(profile_text="driver: {version: '535.309.01'}\n",
                                  source=cloudinit.index_source())
    assert cloudinit.render(spec).format == "cloud-config"
    big = "\n".join(f"# {''.join(random.Random(i).choices(string.ascii_letters, k=70))}" for i in range(240))
    spec = cloudinit.UserDataSpec(profile_text=big + "\n", source=cloudinit.index_source())
    ud = cloudinit.render(spec)
    assert ud.format == "cloud-config+gz+b64+gzip" and ud.data[:2] == b"\x1f\x8b" and ud.size <= 16384
    (tmp_path / "ud").write_bytes(gzip.decompress(ud.data))
    schema_check(tmp_path / "ud")
    with pytest.raises(cloudinit.InputError):
        cloudinit.render(spec, allow_gzip=False)


def merge_with_cloud_init(path: Path) -> dict:
    """Let cloud-init's own user-data processor and cloud-config part handler merge `path`."""
    py = shutil.which("python3", path="/usr/bin")
    assert py, "/usr/bin/python3 (the distribution's, with cloud-init) is missing"
    out = runner.run([py, HERE.parents[1] / "support" / "ci_merge.py", path]).stdout
    return json.loads(out)


def test_mime_parts_validate_and_append(tmp_path: Path, token_file: Path) -> None:
    fake_wheel(tmp_path / "store")
    part = tmp_path / "operator.yaml"
    part.write_text("#cloud-config\nruncmd:\n- [touch, /run/operator-was-here]\npackages: [htop]\n"
                    "write_files:\n- path: /etc/operator\n  content: hello\n")
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho hello\n")
    out = tmp_path / "user-data"
    code, _, err = render_cli("--profile", str(profile_file(tmp_path)), "--token-file", str(token_file),
                              "--part", str(part), "--part", str(script), "--out", str(out))
    assert code == 0, err
    parts = cloudinit.unpack(out.read_bytes())
    assert [p[0] for p in parts] == ["text/cloud-config", "text/cloud-config", "text/x-shellscript"]
    for i, (ctype, text) in enumerate(parts):
        if ctype == "text/cloud-config":
            (tmp_path / f"part{i}").write_text(text)
            assert "Valid cloud-config" in schema_check(tmp_path / f"part{i}")
    ours = yaml.safe_load(parts[0][1])
    assert ours["merge_how"] == cloudinit.MERGE_HOW
    assert "Merge-Type: list(append)+dict(no_replace,recurse_list)+str()" in out.read_text()
    merged = merge_with_cloud_init(out)
    assert merged["runcmd"] == [*ours["runcmd"], ["touch", "/run/operator-was-here"]]
    assert merged["packages"] == [*ours["packages"], "htop"]
    assert [f["path"] for f in merged["write_files"]][-1] == "/etc/operator"
    assert "/etc/nodeprep/bootstrap-token" in [f["path"] for f in merged["write_files"]]


def test_bad_part_is_refused(tmp_path: Path) -> None:
    fake_wheel(tmp_path / "store")
    part = tmp_path / "notes.txt"
    part.write_text("hello\n")
    code, _, err = render_cli("--profile", str(profile_file(tmp_path)), "--part", str(part))
    assert code == 2
    assert err.strip() == (f"error: --part {part}: first line must be '#cloud-config' or a '#!' "
                           "interpreter line")


def test_output_is_deterministic(tmp_path: Path, token_file: Path) -> None:
    fake_wheel(tmp_path / "store")
    profile = profile_file(tmp_path, extra=_labels(600, random_values=False))
    a = render_cli("--profile", str(profile), "--token-file", str(token_file))[1]
    b = render_cli("--profile", str(profile), "--token-file", str(token_file))[1]
    assert a == b and a


def test_bootstrap_unit_verifies(tmp_path: Path) -> None:
    """systemd's own parser accepts the unit (ExecStart pointed at an existing binary, since nodeprep
    is not installed on this machine; everything else as written onto the node)."""
    tool = runner.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / cloudinit.UNIT_NAME
    text = cloudinit.UNIT.replace(cloudinit.NODEPREP_BIN, "/bin/true")
    assert text != cloudinit.UNIT
    unit.write_text(text)
    result = runner.run([tool, "verify", unit], check=False)
    assert result.returncode == 0, result.stderr
    unit.write_text(text.replace("ExecStart=/bin/true", "ExecStart=relative/true"))
    bad = runner.run([tool, "verify", unit], check=False)
    assert bad.returncode != 0 and "absolute path" in bad.stderr


def test_check_plans_the_user_data_and_the_wheel_and_writes_neither(tmp_path: Path, token_file: Path) -> None:
    profile = profile_file(tmp_path)
    built = fake_wheel(tmp_path / "dist")
    out = tmp_path / "user-data"
    args = ["--profile", str(profile), "--token-file", str(token_file), "--publish-wheel", str(built),
            "--out", str(out)]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code, stdout, err = render_cli(*args, "--check")
    assert code == 0, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "store").exists() and not out.exists()
    would_copy, would_write = stdout.splitlines()
    assert would_copy == f"would copy {built} to {tmp_path / 'store/tools' / built.name}"
    assert would_write.startswith(f"would write {out} (cloud-config, ")
    code, _, err = render_cli(*args)  # the real run: the size the check announced, then nothing to do
    assert code == 0, err
    assert would_write == f"would write {out} (cloud-config, {out.stat().st_size} bytes, mode 0600)"
    assert render_cli(*args, "--check")[1].splitlines()[1] == f"{out}: unchanged"
