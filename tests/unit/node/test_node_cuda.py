"""The CUDA -> minimum driver table (NVIDIA's release-notes table, as data)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeprep import cuda
from nodeprep.errors import InputError


@pytest.mark.parametrize(
    ("toolkit", "driver"),
    [
        ("12.2", "535.54.03"),
        ("12.0", "525.60.13"),
        ("11.8", "520.61.05"),
        ("12.4", "550.54.14"),
        ("13.0", "580.65.06"),
        ("12.2.2", "535.54.03"),
        ("11.0", "450.51.05"),
    ],
)
def test_min_driver(toolkit: str, driver: str) -> None:
    assert cuda.min_driver(toolkit) == driver


def test_max_cuda() -> None:
    assert cuda.max_cuda("535.309.01") == "12.2"
    assert cuda.max_cuda("535.54.03") == "12.2"
    assert cuda.max_cuda("535.54.02") == "12.1"
    assert cuda.max_cuda("525.147.05") == "12.0"
    assert cuda.max_cuda("580.95.05") == "13.0"
    assert cuda.max_cuda("440.33.01") is None


def test_check_messages() -> None:
    ok, msg = cuda.check("12.2", "535.216.03")
    assert ok and "up to CUDA 12.2" in msg
    ok, msg = cuda.check("12.4", "535.309.01")
    assert not ok and "needs driver >= 550.54.14" in msg and "minor-version compatibility" in msg
    ok, msg = cuda.check("13.0", "535.309.01")
    assert not ok and "minor-version" not in msg


def test_table_is_monotonic() -> None:
    rows = sorted(cuda.TOOLKIT_DRIVER.items(), key=lambda kv: cuda.vkey(kv[0]))
    drivers = [cuda.vkey(d) for _, d in rows]
    assert drivers == sorted(drivers)


@pytest.mark.parametrize("bad", ["12", "twelve", "12.7", "99.1", ""])
def test_bad_cuda_version(bad: str) -> None:
    with pytest.raises(InputError, match="--require-cuda"):
        cuda.min_driver(bad)


# Real NVIDIA_REQUIRE_CUDA values of NVIDIA's CUDA images (container-images/cuda dist/<ver>/…/base
# Dockerfiles, amd64), abbreviated after the brand alternatives that matter here.
REQUIRE_12_2 = (
    "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
    "brand=nvidia,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 "
    "brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526"
)
REQUIRE_12_4 = (
    "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
    "brand=tesla,driver>=525,driver<526 brand=unknown,driver>=525,driver<526 "
    "brand=tesla,driver>=535,driver<536 brand=unknown,driver>=535,driver<536"
)


def test_parse_requirement_alternatives_and_constraints() -> None:
    alts = cuda.parse_requirement("cuda>=12.2 brand=tesla,driver>=470,driver<471")
    assert alts == [
        [("cuda", ">=", "12.2")],
        [("brand", "=", "tesla"), ("driver", ">=", "470"), ("driver", "<", "471")],
    ]


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({"driver": "535.309.01", "cuda": "12.2"}, True),  # cuda>=12.2 holds
        ({"driver": "525.147.05", "cuda": "12.0"}, False),  # no alternative holds (brand unknown)
        ({"driver": "525.147.05", "cuda": "12.0", "brand": "Tesla"}, True),  # brand=tesla,525.x
        ({"driver": "470.82.01", "cuda": "11.4", "brand": "geforce"}, True),
        ({"driver": "471.0", "cuda": "11.4", "brand": "geforce"}, False),  # driver<471 fails
    ],
)
def test_requirement_met_ors_alternatives_and_ands_constraints(facts: dict, expected: bool) -> None:  # type: ignore[type-arg]
    assert cuda.requirement_met(cuda.parse_requirement(REQUIRE_12_2), facts) is expected


def test_check_requirement_messages() -> None:
    ok, msg = cuda.check_requirement(REQUIRE_12_2, "535.309.01", source="NVIDIA_REQUIRE_CUDA")
    assert ok and "supports up to CUDA 12.2" in msg
    ok, msg = cuda.check_requirement(REQUIRE_12_4, "535.309.01", source="NVIDIA_REQUIRE_CUDA")
    assert not ok
    assert msg == "NVIDIA_REQUIRE_CUDA requires CUDA >=12.4, but driver 535.309.01 supports up to CUDA 12.2"
    ok, msg = cuda.check_requirement("driver>=550", "535.216.03")
    assert not ok and msg.startswith("--require-cuda requires driver>=550, but driver 535.216.03")
    # a bare version is the toolkit-table check doctor always did
    assert cuda.check_requirement("12.4", "535.309.01") == cuda.check("12.4", "535.309.01")


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ("cuda>>12.2", "malformed constraint 'cuda>>12.2'"),
        ("cuda>=twelve", "cuda needs a version"),
        ("gpu>=1", "malformed constraint 'gpu>=1'"),
        ("brand>=tesla", "brand compares with = or != only"),
        ("cuda>=12.2,", "malformed constraint ''"),
        ("   ", "empty requirement"),
    ],
)
def test_malformed_requirements(bad: str, where: str) -> None:
    with pytest.raises(InputError, match="NVIDIA_REQUIRE_CUDA: " + where.replace("(", r"\(")):
        cuda.parse_requirement(bad, source="NVIDIA_REQUIRE_CUDA")


# The requirement grammar as regular expressions (the way NVIDIA's toolkit documents it): nodeprep.cuda
# parses it without `re` (the container hook imports it on every start); these say what it must accept.
CONSTRAINT_GRAMMAR = r"(cuda|driver|arch|brand)(>=|<=|!=|==|>|<|=)([A-Za-z0-9][A-Za-z0-9._-]*)"
CUDA_GRAMMAR = r"(\d+)\.(\d+)(?:\.\d+)?"
ALPHABET = "cudarivebnt=<>!.,_-0123456789aZ é\u0663"


@settings(max_examples=2000, deadline=None)
@given(st.one_of(
    st.text(alphabet=ALPHABET, max_size=14),
    st.builds("".join, st.lists(st.sampled_from(
        ["cuda", "driver", "arch", "brand", ">=", "<=", "!=", "==", ">", "<", "=", "12", ".", "2", "x",
         "-", "_", "535", "é"]), max_size=6)),
))
def test_constraint_and_version_parsing_follow_the_grammar(text: str) -> None:
    m = re.fullmatch(CONSTRAINT_GRAMMAR, text)
    assert cuda.split_constraint(text) == (m.groups() if m else None)
    c = re.fullmatch(CUDA_GRAMMAR, text, flags=re.ASCII)
    assert cuda.cuda_release(text) == ((int(c[1]), int(c[2])) if c else None)
    assert cuda.is_version(text) == bool(re.fullmatch(r"\d+(\.\d+)*", text, flags=re.ASCII))
