"""Verdicts from real serial console logs of qemu smoke boots (recorded, see data/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodeprep.builder.console import classify, parse_console
from nodeprep.builder.smoke import SmokeResult

NVIDIA_LOAD = ["drm", "drm_kms_helper", "wmi", "video", "nvidia"]
VGEM_LOAD = ["drm", "drm_shmem_helper", "vgem"]


def lines(data: Path, name: str) -> list[str]:
    return (data / "console" / name).read_text(errors="replace").splitlines()


def test_nvidia_on_its_kernel_passes_at_the_gpu_probe(data: Path) -> None:
    verdict, reason, excerpt, outcome = classify(lines(data, "nvidia-535-on-own-kernel.log"),
                                                 load=NVIDIA_LOAD, under_test=["nvidia"])
    assert verdict == "PASS"
    assert "No NVIDIA GPU found" in reason
    assert outcome["nvidia"] == "probe: no GPU (ENODEV)"
    assert outcome["drm_kms_helper"] == "loaded"
    assert "NVRM: No NVIDIA GPU found." in excerpt.splitlines()
    assert "insmod nvidia: No such device" in excerpt.splitlines()
    # busybox insmod retries, the kernel logs the probe twice: the excerpt keeps one copy
    assert excerpt.count("NVRM: No NVIDIA GPU found.") == 1
    # timestamps are stripped so the manifest stays byte-identical between builds
    assert not re.search(r"\[\s*\d+\.\d+\]", excerpt)
    assert "ACPI: bus type drm_connector registered" not in excerpt  # unrelated kernel chatter


def test_excerpt_is_deterministic_across_boots(data: Path) -> None:
    """Two boots differ only in timestamps; shifting every timestamp must not change the excerpt."""
    raw = lines(data, "nvidia-535-on-own-kernel.log")
    shifted = [re.sub(r"\[\s*(\d+)\.(\d+)\]", lambda m: f"[{int(m[1]) + 7:5d}.{m[2]}]", x) for x in raw]
    assert shifted != raw
    a = classify(raw, load=NVIDIA_LOAD, under_test=["nvidia"])
    b = classify(shifted, load=NVIDIA_LOAD, under_test=["nvidia"])
    assert a == b


def test_nvidia_on_another_kernel_fails_quoting_the_kernel(data: Path) -> None:
    verdict, reason, excerpt, outcome = classify(lines(data, "nvidia-535-on-other-kernel.log"),
                                                 load=NVIDIA_LOAD, under_test=["nvidia"])
    assert verdict == "FAIL"
    assert reason == ("nvidia (module under test) failed to load: disagrees about version of symbol "
                      "module_layout (insmod: invalid module format)")
    assert "nvidia: disagrees about version of symbol module_layout" in excerpt.splitlines()
    assert outcome["nvidia"] == "FAIL"


def test_unsigned_and_untrusted_are_told_apart_under_sig_enforce(data: Path) -> None:
    unsigned = classify(lines(data, "vgem-unsigned-sig-enforce.log"), load=VGEM_LOAD, under_test=["vgem"],
                        sig_enforce=True)
    untrusted = classify(lines(data, "vgem-untrusted-key-sig-enforce.log"), load=VGEM_LOAD,
                         under_test=["vgem"], sig_enforce=True)
    assert unsigned[0] == untrusted[0] == "FAIL"
    assert "unsigned module rejected" in unsigned[1]
    assert "key the kernel does not trust" in untrusted[1]
    assert "Key was rejected by service" in unsigned[1] and "Key was rejected by service" in untrusted[1]
    assert "Loading of unsigned module is rejected" in unsigned[2]
    assert "Loading of module with unavailable key is rejected" in untrusted[2]


def test_unsigned_module_passes_when_not_enforced_but_says_so(data: Path) -> None:
    verdict, reason, excerpt, _ = classify(lines(data, "vgem-unsigned.log"), load=VGEM_LOAD,
                                           under_test=["vgem"])
    assert verdict == "PASS"
    assert "not enforced" in reason
    assert ("vgem: module verification failed: signature and/or required key missing - tainting kernel"
            in excerpt)


def test_in_tree_module_on_another_kernel(data: Path) -> None:
    verdict, reason, _, _ = classify(lines(data, "vgem-on-other-kernel.log"), load=VGEM_LOAD,
                                     under_test=["vgem"])
    assert verdict == "FAIL"
    assert "disagrees about version of symbol module_layout" in reason
    assert "(+1 more)" not in reason  # the kernel repeats the line; it is one problem


def test_kernel_panic_fails(data: Path) -> None:
    verdict, reason, excerpt, _ = classify(lines(data, "panic-no-init.log"), load=VGEM_LOAD,
                                           under_test=["vgem"])
    assert verdict == "FAIL"
    assert reason == ("kernel crashed: Kernel panic - not syncing: VFS: Unable to mount root fs on "
                      "unknown-block(0,0)")
    assert "Kernel panic" in excerpt


def test_timeout_while_loading_fails(data: Path) -> None:
    raw = lines(data, "nvidia-535-on-own-kernel.log")
    cut = [x for x in raw if "result nvidia" not in x and "SMOKE: end" not in x and "Power down" not in x]
    verdict, reason, _, _ = classify(cut, load=NVIDIA_LOAD, under_test=["nvidia"], timed_out=True, timeout=30)
    assert verdict == "FAIL"
    assert reason == "timed out after 30s while loading nvidia"


def test_no_output_at_all_is_a_timeout_before_init() -> None:
    verdict, reason, _, _ = classify([], load=NVIDIA_LOAD, under_test=["nvidia"], timed_out=True, timeout=5)
    assert (verdict, reason) == ("FAIL", "kernel timed out after 5s before loading modules")


def test_dependency_failure_is_not_blamed_on_the_module(data: Path) -> None:
    raw = [x.replace("result drm_kms_helper rc=0 ", "result drm_kms_helper rc=1 insmod: can't insert "
                     "'/modules/drm_kms_helper.ko': Unknown symbol in module") for x in
           lines(data, "nvidia-535-on-own-kernel.log")]
    verdict, reason, _, _ = classify(raw, load=NVIDIA_LOAD, under_test=["nvidia"])
    assert verdict == "FAIL"
    assert reason.startswith("drm_kms_helper (in-kernel dependency) failed to load: Unknown symbol in module")


def test_parse_console_reads_markers_after_console_noise(data: Path) -> None:
    boot = parse_console(lines(data, "vgem-unsigned.log"))
    assert boot.started and boot.finished
    assert boot.results == {"drm": (0, ""), "drm_shmem_helper": (0, ""), "vgem": (0, "")}


@pytest.mark.parametrize("verdict", ["PASS", "FAIL"])
def test_result_to_dict_is_stable(verdict: str) -> None:
    a = SmokeResult(verdict=verdict, reason="r", kernel_release="6.1.0-56-amd64", log_excerpt="x",
                    modules={"b": "2", "a": "1"}, duration_s=1.5)
    b = SmokeResult(verdict=verdict, reason="r", kernel_release="6.1.0-56-amd64", log_excerpt="x",
                    modules={"a": "1", "b": "2"}, duration_s=9.0)
    assert a.to_dict() == b.to_dict()
    assert list(a.to_dict()["modules"]) == ["a", "b"]
    assert "duration_s" not in a.to_dict()
    assert a.passed is (verdict == "PASS")


def test_signed_module_under_secure_boot_passes(data: Path) -> None:
    verdict, reason, excerpt, outcome = classify(lines(data, "nvidia-535-signed-secure-boot.log"),
                                                 load=NVIDIA_LOAD, under_test=["nvidia"], sig_enforce=True,
                                                 secure_boot=True)
    assert verdict == "PASS"
    assert reason == ("nvidia loaded up to the GPU probe (NVRM: No NVIDIA GPU found) under UEFI Secure Boot "
                      "(lockdown: integrity)")
    got = excerpt.splitlines()
    assert "secureboot: Secure boot enabled" in got
    assert ("integrity: Loaded X.509 cert 'nodeprep test module signing key: "
            "6f0991e1f0017ccaa9404897b7007829c6d65e9e'") in got
    assert "lockdown: none [integrity] confidentiality" in got
    assert "module verification failed" not in excerpt  # the signature was verified, no taint for it


def test_unsigned_module_under_secure_boot_fails(data: Path) -> None:
    verdict, reason, _, _ = classify(lines(data, "nvidia-535-unsigned-secure-boot.log"), load=NVIDIA_LOAD,
                                     under_test=["nvidia"], sig_enforce=True, secure_boot=True)
    assert verdict == "FAIL"
    assert reason == ("nvidia (module under test) failed to load: unsigned module rejected "
                      "(module.sig_enforce=1) (insmod: Key was rejected by service)")


def test_secure_boot_mode_requires_lockdown(data: Path) -> None:
    raw = [x.replace("lockdown none [integrity] confidentiality", "lockdown [none] integrity confidentiality")
           for x in lines(data, "nvidia-535-signed-secure-boot.log")]
    verdict, reason, _, _ = classify(raw, load=NVIDIA_LOAD, under_test=["nvidia"], secure_boot=True)
    assert (verdict, reason) == ("FAIL", "Secure Boot did not lock the kernel down "
                                         "(lockdown: [none] integrity confidentiality)")
    # a plain boot (no firmware) never passes for a Secure Boot check either
    verdict, reason, _, _ = classify(lines(data, "nvidia-535-on-own-kernel.log"), load=NVIDIA_LOAD,
                                     under_test=["nvidia"], secure_boot=True)
    assert verdict == "FAIL" and "did not lock the kernel down" in reason


def test_enodev_without_the_gpu_probe_fails(data: Path) -> None:
    """A module that returns -ENODEV from init without NVIDIA's probe message (e.g. it never got to
    pci_register_driver) is not the expected no-GPU outcome."""
    raw = [x for x in lines(data, "nvidia-535-on-own-kernel.log") if "NVRM" not in x]
    verdict, reason, _, outcome = classify(raw, load=NVIDIA_LOAD, under_test=["nvidia"])
    assert verdict == "FAIL"
    assert reason == ('nvidia (module under test) failed to load: ENODEV without reaching the GPU probe '
                      '(no "NVRM: No NVIDIA GPU found") (insmod: No such device)')
    assert outcome["nvidia"] == "FAIL"
