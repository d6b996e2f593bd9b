"""Role conventions: every default documented by a comment and declared in meta/argument_specs.yml
(same names, same defaults), prefixed with the role name, and tasks named with fully qualified modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import REPO, ROLES

ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks/main.yml").is_file())
ALL_TASK_FILES = sorted(
    [*ROLES.glob("*/tasks/*.yml"), *ROLES.glob("*/handlers/*.yml"), *REPO.glob("playbooks/*.yml")]
)


def _load(path: Path):  # type: ignore[no-untyped-def]
    return yaml.safe_load(path.read_text())


def test_expected_roles_exist() -> None:
    assert set(ROLE_NAMES) >= {
        "nodeprep_install",
        "driver_build",
        "nvidia_driver",
        "node_labels",
        "container_runtime",
        "kube_join",
    }


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_defaults_match_argument_specs(role: str) -> None:
    defaults = _load(ROLES / role / "defaults/main.yml") or {}
    spec = _load(ROLES / role / "meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(spec), "defaults/main.yml and meta/argument_specs.yml disagree"
    for name, value in defaults.items():
        assert spec[name].get("default") == value, f"{role}: {name} default differs from argument_specs"
        assert spec[name].get("description"), f"{role}: {name} has no description"
        assert name.startswith(role + "_"), f"{role}: {name} is not prefixed with the role name"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_has_a_comment(role: str) -> None:
    lines = (ROLES / role / "defaults/main.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")) and ":" in line:
            assert i > 0 and lines[i - 1].startswith("#"), (
                f"{role}: {line.split(':')[0]} has no comment above it"
            )


def _tasks(data):  # type: ignore[no-untyped-def]
    for item in data or []:
        if isinstance(item, dict):
            yield item
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
                yield from _tasks(item.get(key))


def _controller_upgrade(argv: object) -> bool:
    """An argv (a template) running the controller's `nodeprep upgrade` cluster verbs."""
    text = str(argv)
    return "upgrade_nodeprep_controller" in text and any(
        f"'upgrade', '{verb}'" in text for verb in ("plan", "admit", "prepare", "finish", "fail", "budget")
    ) or ("'upgrade', 'plan'" in text and "'-m', 'nodeprep'" in text)


@pytest.mark.parametrize("path", ALL_TASK_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_tasks_use_fqcn_and_no_shell_for_library_work(path: Path) -> None:
    known = {
        "name",
        "when",
        "register",
        "tags",
        "notify",
        "listen",
        "delegate_to",
        "run_once",
        "check_mode",
        "changed_when",
        "failed_when",
        "loop",
        "loop_control",
        "vars",
        "become",
        "block",
        "rescue",
        "always",
        "no_log",
        "environment",
        "ignore_errors",
        "until",
        "retries",
        "delay",
        "any_errors_fatal",
        "throttle",
        "args",
        "diff",
        "timeout",
        "delegate_facts",
    }
    for task in _tasks(_load(path)):
        if "hosts" in task or "import_playbook" in task:
            continue
        actions = [k for k in task if k not in known]
        assert len(actions) <= 1, f"{path}: {task.get('name')}: {actions}"
        for action in actions:
            assert action.count(".") >= 2, f"{path}: {task.get('name')}: {action} is not fully qualified"
            argv = task[action].get("argv", [""]) if isinstance(task[action], dict) else [""]
            if action.split(".")[-1] == "command" and (argv[0] == "kubectl" or _controller_upgrade(argv)):
                # cordon/drain/uncordon, `nodeprep upgrade` plan/admit/prepare/finish/fail/budget: cluster API
                # calls from the controller, not node work
                assert task.get("delegate_to") == "localhost" and "changed_when" in task, task.get("name")
                continue
            assert action.split(".")[-1] not in ("shell", "command", "raw", "script"), (
                f"{path}: {task.get('name')}: use a nodeprep.fleet module instead of {action}"
            )
        assert task.get("name"), f"{path}: unnamed task {task}"
