"""PLAY RECAP parsing, on output recorded from a real ansible-playbook run against the test hosts."""

from __future__ import annotations

from tests.support.testhosts import PlaybookRun, parse_recap

# Recorded from ansible-core 2.19 (default callback), playbooks/site.yml against two test hosts.
RECORDED = """\
TASK [nodeprep_install : Nodeprep install | Build the zipapp on the controller] ***
changed: [node1 -> localhost]

TASK [nodeprep_install : Nodeprep install | Copy the zipapp to the node] *******
changed: [node2]
ok: [node1]

PLAY RECAP *********************************************************************
node1                      : ok=10   changed=4    unreachable=0    failed=0    skipped=2    rescued=0    ignored=0   
node2                      : ok=7    changed=3    unreachable=1    failed=1    skipped=2    rescued=0    ignored=0   

[WARNING]: Could not match supplied host pattern, ignoring: build_hosts
"""  # noqa: E501, W291


def test_parse_recap_reads_every_host() -> None:
    recap = parse_recap(RECORDED)
    assert recap == {
        "node1": {
            "ok": 10,
            "changed": 4,
            "unreachable": 0,
            "failed": 0,
            "skipped": 2,
            "rescued": 0,
            "ignored": 0,
        },
        "node2": {
            "ok": 7,
            "changed": 3,
            "unreachable": 1,
            "failed": 1,
            "skipped": 2,
            "rescued": 0,
            "ignored": 0,
        },
    }


def test_parse_recap_without_recap_is_empty() -> None:
    assert parse_recap("ERROR! the playbook could not be found\n") == {}


def test_changed_tasks_name_host_and_task() -> None:
    run = PlaybookRun(0, RECORDED, parse_recap(RECORDED))
    assert run.changed_tasks() == [
        "[node1 -> localhost] => nodeprep_install : Nodeprep install | Build the zipapp on the controller",
        "[node2] => nodeprep_install : Nodeprep install | Copy the zipapp to the node",
    ]
