"""The Ansible side repeats nodeprep.vocab's values (role YAML and module DOCUMENTATION cannot import
Python when ansible-lint reads them): each copy must equal the library's constant."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from nodeprep.profile.fields import FIELDS
from nodeprep.vocab import (
    BRANCH_POLICIES,
    DEFAULT_FLAVOUR,
    DEFAULT_MODULES,
    FABRICMANAGER_MODES,
    FLAVOURS,
    GPUDIRECT_MODULES,
    KERNEL_MODULES,
)

from .conftest import ROLES


def _role(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    defaults = yaml.safe_load((ROLES / name / "defaults/main.yml").read_text())
    specs = yaml.safe_load((ROLES / name / "meta/argument_specs.yml").read_text())
    return defaults, specs["argument_specs"]["main"]["options"]


def test_nvidia_driver_role_follows_the_vocabulary() -> None:
    defaults, options = _role("nvidia_driver")
    assert defaults["nvidia_driver_modules"] == list(DEFAULT_MODULES)
    assert options["nvidia_driver_modules"]["default"] == list(DEFAULT_MODULES)
    assert set(defaults["nvidia_driver_modules"]) <= set(KERNEL_MODULES)
    assert defaults["nvidia_driver_gpudirect"] == options["nvidia_driver_gpudirect"]["default"] == []
    assert options["nvidia_driver_gpudirect"]["choices"] == list(GPUDIRECT_MODULES)
    assert options["nvidia_driver_fabricmanager"]["choices"] == list(FABRICMANAGER_MODES)
    assert defaults["nvidia_driver_fabricmanager"] == options["nvidia_driver_fabricmanager"]["default"] \
        == FABRICMANAGER_MODES[0]
    assert defaults["nvidia_driver_persistenced"] is options["nvidia_driver_persistenced"]["default"] is True
    # "" = whichever flavour the store has
    assert options["nvidia_driver_flavour"]["choices"] == ["", *FLAVOURS]
    assert options["nvidia_driver_branch_policy"]["choices"] == list(BRANCH_POLICIES)
    assert defaults["nvidia_driver_branch_policy"] == options["nvidia_driver_branch_policy"]["default"] \
        == BRANCH_POLICIES[0]


def test_driver_build_role_follows_the_vocabulary() -> None:
    defaults, options = _role("driver_build")
    assert options["driver_build_flavour"]["choices"] == list(FLAVOURS)
    assert defaults["driver_build_flavour"] == DEFAULT_FLAVOUR


def _module(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A module's documented options and its argument_spec (in module_utils/nodeprep_op_*)."""
    doc = importlib.import_module(f"ansible_collections.nodeprep.fleet.plugins.modules.{name}")
    code = importlib.import_module(
        f"ansible_collections.nodeprep.fleet.plugins.module_utils.{name.replace('nodeprep_', 'nodeprep_op_')}"
    )
    return yaml.safe_load(doc.DOCUMENTATION)["options"], code.argument_spec()


def test_driver_and_build_modules_follow_the_vocabulary(collection_on_path: Path) -> None:
    for options in _module("nodeprep_driver"):
        assert options["modules"]["default"] == list(DEFAULT_MODULES)
        assert options["flavour"]["choices"] == list(FLAVOURS)
        assert options["branch_policy"]["choices"] == list(BRANCH_POLICIES)
        assert options["branch_policy"]["default"] == BRANCH_POLICIES[0]
        assert options["gpudirect"]["choices"] == list(GPUDIRECT_MODULES)
        assert options["gpudirect"]["default"] == []
        assert options["fabricmanager"]["choices"] == list(FABRICMANAGER_MODES)
        assert options["fabricmanager"]["default"] == FABRICMANAGER_MODES[0]
        assert options["persistenced"]["default"] is True
    for options in _module("nodeprep_build"):
        assert options["flavour"]["choices"] == list(FLAVOURS)
        assert options["flavour"]["default"] == DEFAULT_FLAVOUR


# The modules that validate the node profile, and the roles that call them: each takes the CA pin
# opt-out (`join --insecure-skip-ca-verification`), so a fleet joining without pins can write and
# read its profile (issue #25).
PROFILE_MODULES = {"nodeprep_profile": "nodeprep_install", "nodeprep_info": "nodeprep_install",
                   "nodeprep_runtime": "container_runtime", "nodeprep_join": "kube_join"}


def test_every_profile_front_end_takes_the_ca_pin_opt_out(collection_on_path: Path) -> None:
    option = "insecure_skip_ca_verification"
    for name, role in PROFILE_MODULES.items():
        doc = yaml.safe_load(
            importlib.import_module(f"ansible_collections.nodeprep.fleet.plugins.modules.{name}").DOCUMENTATION)
        fragments = doc["extends_documentation_fragment"]
        documented = doc["options"].get(option) or (
            "nodeprep.fleet.nodeprep.profile" in fragments and _fragment("PROFILE")[option])
        assert documented and documented["type"] == "bool" and documented["default"] is False, name
        assert _module(name)[1][option] == {"type": "bool", "default": False}, name
        defaults, options = _role(role)
        variable = f"{role}_{option}"
        assert defaults[variable] is False and options[variable]["default"] is False, role
        tasks = [t for path in sorted((ROLES / role / "tasks").glob("*.yml"))
                 for t in yaml.safe_load(path.read_text()) or []]
        calls = [t[f"nodeprep.fleet.{name}"] for t in tasks if f"nodeprep.fleet.{name}" in t]
        # every call that hands the module a profile hands it the opt-out too
        with_profile = [c for c in calls if {"content", "profile"} & set(c)]
        assert with_profile, (role, name)
        assert all(variable in str(c.get(option)) for c in with_profile), (role, name)


def _fragment(name: str) -> dict[str, Any]:
    frag = importlib.import_module("ansible_collections.nodeprep.fleet.plugins.doc_fragments.nodeprep")
    return yaml.safe_load(getattr(frag.ModuleDocFragment, name))["options"]


# driver fields the node's GPU self-test reads, not install (the field table's `ansible`)
NOT_INSTALLED = {f.path for f in FIELDS if f.section == "driver" and not f.ansible}


def test_every_driver_field_is_an_option_of_the_driver_module_and_role(collection_on_path: Path) -> None:
    """The profile's driver fields (version, branch, gpus, branch_policy, ...) are the nodeprep_driver
    module's options of the same key, and the nvidia_driver role's variables of that key, which its
    install task passes to the module (issue 27: the GPUs and the branch pin in every front-end)."""
    documented, spec = _module("nodeprep_driver")
    defaults, options = _role("nvidia_driver")
    tasks = yaml.safe_load((ROLES / "nvidia_driver/tasks/install.yml").read_text())
    task = tasks[0]["nodeprep.fleet.nodeprep_driver"]
    for f in FIELDS:
        if f.section != "driver" or f.path in NOT_INSTALLED:
            continue
        variable = f"nvidia_driver_{f.key}"
        assert f.key in documented and f.key in spec, f.path
        assert variable in defaults and variable in options, f.path
        assert variable in str(task.get(f.key)), (f.path, task.get(f.key))
