# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_driver does on the node (its documentation is in
plugins/modules/nodeprep_driver.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host

# nodeprep.vocab.DEFAULT_MODULES, FLAVOURS and BRANCH_POLICIES (module_utils cannot import nodeprep
# before the module runs; tests/unit/fleet/test_vocab_drift.py keeps them equal)
DEFAULT_MODULES = ["nvidia", "nvidia-uvm", "nvidia-modeset"]
FLAVOURS = ["proprietary", "open"]
BRANCH_POLICIES = ["newest", "oldest"]
GPUDIRECT_MODULES = ["nvidia-peermem", "nvidia-fs", "gdrdrv"]  # nodeprep.vocab.GPUDIRECT_MODULES
FABRICMANAGER_MODES = ["auto", "always", "never"]  # nodeprep.vocab.FABRICMANAGER_MODES


# the options that are the profile's driver fields (driver.KEY, through nodeprep.profile.overrides)
# BEGIN generated from nodeprep/profile/fields.py by `python -m nodeprep.profile.generate --write`
DRIVER_OPTIONS = {
    "version": {"type": "str"},
    "branch": {"type": "str"},
    "gpus": {"type": "str"},
    "branch_policy": {"type": "str", "choices": ["newest", "oldest"], "default": "newest"},
    "flavour": {"type": "str", "choices": ["proprietary", "open"]},
    "store": {"type": "str"},
    "registry_auth": {"type": "path"},
    "ca_file": {"type": "path"},
    "insecure_http": {"type": "bool", "default": False},
    "kernel": {"type": "str"},
    "modules": {"type": "list", "elements": "str", "default": ["nvidia", "nvidia-uvm", "nvidia-modeset"]},
    "gpudirect": {
        "type": "list",
        "elements": "str",
        "choices": ["nvidia-peermem", "nvidia-fs", "gdrdrv"],
        "default": [],
    },
    "persistenced": {"type": "bool", "default": True},
    "fabricmanager": {"type": "str", "choices": ["auto", "always", "never"], "default": "auto"},
    "keep_boot_kernel": {"type": "bool", "default": False},
}
# END generated


def argument_spec():
    return host.node_argument_spec(
        **DRIVER_OPTIONS,
        state={"type": "str", "choices": ["present", "active", "absent"], "default": "active"},
        arch={"type": "str", "default": "amd64"},
        load={"type": "bool", "default": False},
        doctor={"type": "bool", "default": False},
        doctor_checks={"type": "list", "elements": "str", "default": []},
        require_cuda={"type": "str"},
    )


# version (or branch or gpus, which choose it) and store name what to install; state=absent installs nothing
REQUIRED_IF = [
    ("state", "present", ["version", "branch", "gpus"], True),
    ("state", "active", ["version", "branch", "gpus"], True),
    ("state", "present", ["store"]), ("state", "active", ["store"]),
]


def snapshot(state):
    return {
        "active": state.active,
        "installed": {v: sorted(i.kernels) for v, i in sorted(state.installed.items())},
    }


def request_of(p, usecase, model, overrides):
    """The nodeprep.node.driververbs request for the task's options: the profile's typed Driver section
    (no flavour: whichever the store has), the options over it as flags over a profile."""
    given = {f"driver.{k}": tuple(p[k]) if spec["type"] == "list" else p[k]
             for k, spec in DRIVER_OPTIONS.items()}
    driver = overrides.driver_with(model.UNSET_DRIVER, given)
    return usecase.DriverInstall(driver, arch=p["arch"], activate=p["state"] == "active", load=p["load"])


def run(module):
    """The nodeprep_driver task on a validated AnsibleModule (see modules/nodeprep_driver.py)."""
    p = module.params
    state_mod, usecase, model, overrides, join_activation = host.import_nodeprep(
        module, "nodeprep.node.state", "nodeprep.node.driververbs", "nodeprep.profile.model",
        "nodeprep.profile.overrides", "nodeprep.join.activation",
    )
    from dataclasses import replace
    from pathlib import Path

    root = Path(p["root"])
    if p["state"] == "absent":
        uninstall(module, usecase, join_activation.CALLBACKS, root)
        return
    activate = p["state"] == "active"
    try:
        request = request_of(p, usecase, model, overrides)  # a value its field's rule refuses: fail_from
        if module.check_mode:  # the library's own plan: what install would change
            planned = usecase.install_driver(root, replace(request, check=True),
                                             callbacks=join_activation.CALLBACKS)
            before, plan, version = planned.before, planned.plan, planned.version
            after = plan.after(before)
            findings = []
            if p["doctor"]:  # the gate the real run ends with, on the node as it is now
                (doctor_mod,) = host.import_nodeprep(module, "nodeprep.node.doctor")
                findings, _, _ = host.doctor_problems(
                    doctor_mod, root, p["doctor_checks"], p["require_cuda"], None
                )
            module.exit_json(
                preflight=host.report_findings(module, findings),
                changed=plan.changes,
                version=version,
                kernel=plan.request.kernel,
                active=after.active,
                previous=before.active,
                installed=sorted(after.installed),
                loaded=False,
                reboot_required=False,
                notes=["check mode: nothing fetched or written"] + list(plan.notes),
                plan=plan.to_dict(),
                diff={"before": snapshot(before), "after": snapshot(after)},
            )
        before = state_mod.load_state(root)
        result = usecase.install_driver(root, request, callbacks=join_activation.CALLBACKS)
        version = result.version
        after = state_mod.load_state(root)
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e, version=p["version"])
    activation = result.activation
    loaded = bool(activation and activation.loaded)
    notes = list(result.notes) + (list(activation.notes) if activation else [])
    out = {
        "changed": result.changed,
        "version": result.version,
        "kernel": result.kernel,
        "active": after.active,
        "previous": before.active,
        "installed": sorted(after.installed),
        "loaded": loaded,
        "reboot_required": bool(activate and p["load"] and root.resolve() == Path("/") and not loaded),
        "notes": notes,
    }
    if module._diff:
        out["diff"] = {"before": snapshot(before), "after": snapshot(after)}
    if p["doctor"] and not result.changed:
        (doctor_mod,) = host.import_nodeprep(module, "nodeprep.node.doctor")
        try:
            problems, checks, _ = host.doctor_problems(
                doctor_mod, root, p["doctor_checks"], p["require_cuda"], version if activate else None
            )
        except host.nodeprep_errors(module) as e:
            host.fail_from(module, e, version=version)
        out["doctor"] = {"ok": not problems, "checks": checks}
        if problems:
            module.fail_json(msg="doctor: " + "; ".join(problems), **out)
    module.exit_json(**out)


def uninstall(module, usecase, callbacks, root):
    """state=absent: `nodeprep uninstall` (check mode: its plan, `nodeprep uninstall --check`)."""
    from pathlib import Path

    live = root.resolve() == Path("/")
    try:
        done = usecase.uninstall_node(root, usecase.Uninstall(check=module.check_mode), callbacks=callbacks)
        if module.check_mode:
            plan = done
            for line in plan.kept:
                module.warn(line)
            module.exit_json(changed=plan.changes, version=module.params["version"], active=None,
                             installed=[], loaded=False, reboot_required=False,
                             notes=["check mode: nothing removed"], removed=list(plan.remove),
                             restored=list(plan.restore), kept=list(plan.kept), plan=plan.to_dict(live))
        result = done
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    for line in result.kept:
        module.warn(line)
    module.exit_json(changed=result.changed, version=module.params["version"], active=None, installed=[],
                     loaded=False, reboot_required=any("reboot" in n for n in result.notes),
                     notes=list(result.notes), removed=list(result.removed), restored=list(result.restored),
                     kept=list(result.kept))


def main():
    run(AnsibleModule(argument_spec=argument_spec(), required_if=REQUIRED_IF, supports_check_mode=True))
