"""Label syntax (k8s apimachinery rules), GFD's sanitise, and the NodeRestriction split."""

from __future__ import annotations

import pytest

from nodeprep.errors import InputError
from nodeprep.labels.validate import (
    kubelet_flag_value,
    parse_label_arg,
    sanitise,
    split_for_kubelet,
    validate_label,
)


# GFD's own TestSanitise cases (internal/lm/resource_test.go)
@pytest.mark.parametrize("raw,want", [
    ("a space separated string", "a-space-separated-string"),
    ("some(thing)else", "somethingelse"),
    ("some ( thing )else", "some-thing-else"),
    ("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal"),
    (" input  with multiple   spaces   ", "input-with-multiple-spaces"),
    ("some [ / thing / ]else", "some-thing-else"),
    ("some / thing /else", "some-thing-else"),
    ("some-thing.else_new", "some-thing.else_new"),
])
def test_sanitise_matches_gfd(raw: str, want: str) -> None:
    assert sanitise(raw) == want


@pytest.mark.parametrize("key,value", [
    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
    ("simple", ""),
    ("a", "b"),
    ("x" * 63, "y" * 63),
    (("a" * 63 + ".") * 3 + "b" * 61 + "/" + "n" * 63, "v"),  # prefix exactly 253
    ("node.kubernetes.io/instance-type", "Standard_NC24ads_A100_v4"),
    ("example.com/a_b.c-d", "1.2.3"),
])
def test_valid_labels(key: str, value: str) -> None:
    assert validate_label(key, value) == []


@pytest.mark.parametrize("key,value,fragment", [
    ("x" * 64, "v", "longer than 63"),
    ("p/" + "x" * 64, "v", "longer than 63"),
    (("a" * 63 + ".") * 4 + "b/n", "v", "prefix is longer than 253"),
    ("k", "v" * 64, "value is longer than 63"),
    ("", "v", "key is empty"),
    ("/name", "v", "prefix is empty"),
    ("prefix/", "v", "name is empty"),
    ("a/b/c", "v", "more than one '/'"),
    ("Example.com/x", "v", "not a DNS subdomain"),
    ("exa_mple.com/x", "v", "not a DNS subdomain"),
    ("-example.com/x", "v", "not a DNS subdomain"),
    ("example.com/-x", "v", "start and end with an alphanumeric"),
    ("example.com/x y", "v", "start and end with an alphanumeric"),
    ("k", "-v", "start and end"),
    ("k", "v_", "start and end"),
    ("k", "a b", "start and end"),
    ("k", "a/b", "start and end"),
    ("k", "ü", "start and end"),
])
def test_invalid_labels(key: str, value: str, fragment: str) -> None:
    problems = validate_label(key, value)
    assert problems and any(fragment in p for p in problems), problems


def test_parse_label_arg() -> None:
    assert parse_label_arg("example.com/team=ml") == ("example.com/team", "ml")
    assert parse_label_arg("empty=") == ("empty", "")
    with pytest.raises(InputError, match="expected KEY=VALUE"):
        parse_label_arg("novalue")
    with pytest.raises(InputError, match="invalid --label 'bad key=x'"):
        parse_label_arg("bad key=x")


def test_split_for_kubelet_node_restriction() -> None:
    labels = {
        "nvidia.com/gpu.product": "Tesla-T4",
        "nodeprep.dev/driver-version": "535.309.01",
        "example.com/team": "ml",
        "node.kubernetes.io/instance-type": "g4dn.xlarge",
        "topology.kubernetes.io/zone": "us-east-1a",
        "topology.kubernetes.io/region": "us-east-1",
        "kubernetes.io/hostname": "n1",
        "beta.kubernetes.io/arch": "amd64",
        "pool.node.kubernetes.io/name": "gpu",  # subdomain of node.kubernetes.io
        "node.kubernetes.io/pool": "gpu-a",
        "kubelet.kubernetes.io/foo": "x",
        "x.kubelet.kubernetes.io/foo": "x",
        "node-role.kubernetes.io/worker": "",
        "kubernetes.io/role": "gpu",
        "topology.kubernetes.io/rack": "r1",  # not in the allowed exact set
        "k8s.io/thing": "x",
        "sub.k8s.io/thing": "x",
        "node-restriction.kubernetes.io/tier": "gold",
        "a.node-restriction.kubernetes.io/tier": "gold",
        "notkubernetes.io/x": "y",  # only a suffix match on a dot counts
    }
    mine, api = split_for_kubelet(labels)
    assert set(mine) == {
        "nvidia.com/gpu.product", "nodeprep.dev/driver-version", "example.com/team",
        "node.kubernetes.io/instance-type", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
        "kubernetes.io/hostname", "beta.kubernetes.io/arch", "pool.node.kubernetes.io/name",
        "node.kubernetes.io/pool", "kubelet.kubernetes.io/foo", "x.kubelet.kubernetes.io/foo",
        "notkubernetes.io/x",
    }
    assert set(api) == {
        "node-role.kubernetes.io/worker", "kubernetes.io/role", "topology.kubernetes.io/rack", "k8s.io/thing",
        "sub.k8s.io/thing", "node-restriction.kubernetes.io/tier", "a.node-restriction.kubernetes.io/tier",
    }
    assert set(mine) | set(api) == set(labels)


def test_kubelet_flag_value_refuses_node_role_with_reason() -> None:
    assert kubelet_flag_value({"b.io/x": "1", "a.io/y": ""}) == "a.io/y=,b.io/x=1"
    with pytest.raises(InputError, match="node-role.kubernetes.io/worker: a kubelet may not set node-role"):
        kubelet_flag_value({"node-role.kubernetes.io/worker": ""})
    with pytest.raises(InputError, match="reserved for administrators"):
        kubelet_flag_value({"node-restriction.kubernetes.io/x": "y"})
    with pytest.raises(InputError, match="invalid label"):
        kubelet_flag_value({"ok.io/x": "bad value"})
