# Copyright: nodeprep maintainers
# Apache-2.0
"""What nodeprep.fleet.nodeprep_build does on the node (its documentation is in
plugins/modules/nodeprep_build.py). Its entry point is main()."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.nodeprep.fleet.plugins.module_utils import nodeprep_host as host


def argument_spec():
    return host.node_argument_spec(
        driver={"type": "str"},
        flavour={"type": "str", "choices": ["proprietary", "open"], "default": "proprietary"},
        os_name={"type": "str", "default": "debian-12"},
        kernel={"type": "str"},
        arch={"type": "str", "default": "amd64"},
        store={"type": "path", "required": True},
        cache={"type": "path", "default": "/var/cache/nodeprep"},
        userspace={"type": "bool", "default": True},
        smoke_test={"type": "bool"},
        jobs={"type": "int"},
        rebuild={"type": "bool", "default": False},
    )


def run(module):
    """The nodeprep_build task on a validated AnsibleModule (see modules/nodeprep_build.py)."""
    p = module.params
    driver_mod, resolve_mod, artifact, targets = host.import_nodeprep(
        module, "nodeprep.builder.driver", "nodeprep.builder.resolve", "nodeprep.artifact", "nodeprep.targets"
    )
    from pathlib import Path

    if module.check_mode:
        listed = False
        if p["driver"] and p["kernel"] and Path(p["store"], "index.json").is_file():
            name = artifact.artifact_name(
                "kmod", p["driver"], arch=p["arch"], flavour=p["flavour"], kernel_release=p["kernel"]
            )
            try:  # a store index nodeprep refuses (a name that is a path, a field's type) fails the task
                listed = artifact.LocalStore(Path(p["store"])).lookup(name) is not None
            except host.nodeprep_errors(module) as e:
                host.fail_from(module, e)
        module.exit_json(changed=not listed or p["rebuild"], cached=listed)
    try:
        req = resolve_mod.BuildRequest(
            driver=p["driver"] or None,
            flavour=p["flavour"],
            target=targets.get(p["os_name"]),
            kernel=p["kernel"] or None,
            arch=p["arch"],
            store=Path(p["store"]),
            cache=Path(p["cache"]),
            jobs=p["jobs"],
            rebuild=p["rebuild"],
            userspace=p["userspace"],
            smoke_test=p["smoke_test"],
        )
        result = driver_mod.build_driver(req)
    except host.nodeprep_errors(module) as e:
        host.fail_from(module, e)
    module.exit_json(changed=not result.cached, cached=result.cached, build=result.to_dict())


def main():
    run(AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True))
