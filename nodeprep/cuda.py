"""Which driver a CUDA toolkit needs (Linux x86_64), as data.

Source: NVIDIA's CUDA release notes table "CUDA Toolkit and Corresponding Driver Versions"
(toolkit-bundled driver per release) and the minor-version compatibility rule
(docs.nvidia.com/deploy/cuda-compatibility): from 11.x on, a toolkit runs on any driver of its
major family's minimum (11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580.65.06) with minor-version
compatibility (PTX JIT limits apply). `min_driver` answers the strict question (the toolkit's own
driver); `min_driver_compat` the relaxed one.

`check_requirement` evaluates what `doctor --require-cuda` and the container hooks
(nodeprep.containerhooks.spec, nodeprep.containerhooks.gate) are given: a bare CUDA version ("12.2")
or an NVIDIA requirement expression as CUDA images carry it in NVIDIA_REQUIRE_CUDA ("cuda>=12.2
brand=tesla,driver>=470,driver<471 ...").
Grammar, as NVIDIA's container toolkit documents it: constraints `cuda`, `driver`, `arch`, `brand`
with an operator (`>=`, `<=`, `>`, `<`, `=`, `==`, `!=`) and a value; space-separated alternatives are
ORed, comma-separated constraints within one alternative are ANDed. The facts are the driver version
and the CUDA version it supports (this table: the same source as doctor); GPU brand and compute
architecture are not known to nodeprep, so a constraint on them never holds. This module stays
import-light (no re, dataclasses or typing at run time): the container hook imports it on every
container start that carries a requirement.
"""

from __future__ import annotations

from .errors import InputError

KEYS = ("cuda", "driver", "arch", "brand")
OPERATORS = (">=", "<=", "!=", "==", ">", "<", "=")  # two-character ones first
VALUE_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
VALUE_CHARS = VALUE_START | frozenset("._-")


def is_version(text: str) -> bool:
    """Dot-separated ASCII decimal numbers ("535", "12.2", "535.309.01")."""
    return all(p.isascii() and p.isdigit() for p in text.split("."))


def split_constraint(part: str) -> tuple[str, str, str] | None:
    """`key op value` (e.g. "driver>=470") -> (key, op, value); None when malformed."""
    key = next((k for k in KEYS if part.startswith(k)), None)
    if key is None:
        return None
    rest = part[len(key):]
    op = next((o for o in OPERATORS if rest.startswith(o)), None)
    if op is None:
        return None
    value = rest[len(op):]
    if not value or value[0] not in VALUE_START or not set(value) <= VALUE_CHARS:
        return None
    return key, op, value

# CUDA release (GA) -> minimum Linux driver shipped with it
TOOLKIT_DRIVER: dict[str, str] = {
    "13.1": "590.44.01",
    "13.0": "580.65.06",
    "12.9": "575.51.03",
    "12.8": "570.26",
    "12.6": "560.28.03",
    "12.5": "555.42.02",
    "12.4": "550.54.14",
    "12.3": "545.23.06",
    "12.2": "535.54.03",
    "12.1": "530.30.02",
    "12.0": "525.60.13",
    "11.8": "520.61.05",
    "11.7": "515.43.04",
    "11.6": "510.39.01",
    "11.5": "495.29.05",
    "11.4": "470.42.01",
    "11.3": "465.19.01",
    "11.2": "460.27.03",
    "11.1": "455.23",
    "11.0": "450.51.05",
}
# CUDA major -> (minimum driver with minor-version compatibility, first driver of the next family)
FAMILY: dict[int, tuple[str, str | None]] = {
    11: ("450.80.02", "525"),
    12: ("525.60.13", "580"),
    13: ("580.65.06", None),
}



def cuda_release(text: str) -> tuple[int, int] | None:
    """(major, minor) of "12.2" or "12.2.1"; None for anything else."""
    parts = text.split(".")
    if len(parts) not in (2, 3) or not is_version(text):
        return None
    return int(parts[0]), int(parts[1])


def vkey(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def parse_cuda(version: str) -> str:
    release = cuda_release(version.strip())
    if release is None:
        raise InputError(f"--require-cuda: {version!r} is not a CUDA version (e.g. 12.2)")
    key = f"{release[0]}.{release[1]}"
    if key not in TOOLKIT_DRIVER:
        raise InputError(
            f"--require-cuda: CUDA {key} is not in nodeprep's table "
            f"(known: {', '.join(sorted(TOOLKIT_DRIVER, key=vkey))})"
        )
    return key


def min_driver(cuda: str) -> str:
    """The driver the CUDA toolkit release `cuda` ships with (strict minimum)."""
    return TOOLKIT_DRIVER[parse_cuda(cuda)]


def max_cuda(driver: str) -> str | None:
    """The newest CUDA release whose toolkit driver `driver` satisfies (strict)."""
    ok = [c for c, d in TOOLKIT_DRIVER.items() if vkey(driver) >= vkey(d)]
    return max(ok, key=vkey) if ok else None


def check(cuda: str, driver: str) -> tuple[bool, str]:
    """(ok, one-line message) for running CUDA `cuda` applications on `driver`."""
    need = min_driver(cuda)
    if vkey(driver) >= vkey(need):
        return (
            True,
            f"CUDA {parse_cuda(cuda)} needs driver >= {need}; "
            f"driver {driver} supports up to CUDA {max_cuda(driver)}",
        )
    major = int(parse_cuda(cuda).split(".")[0])
    family_min, _ = FAMILY.get(major, (need, None))
    compat = (
        f" (minor-version compatibility would accept >= {family_min} with PTX JIT limits)"
        if vkey(driver) >= vkey(family_min)
        else ""
    )
    return False, (
        f"CUDA {parse_cuda(cuda)} needs driver >= {need}, active driver is {driver} "
        f"(supports up to CUDA {max_cuda(driver) or 'none'}){compat}"
    )


def _unknown_property(part: str) -> bool:
    """True for a constraint NVIDIA's toolkit skips: empty, or a property it does not know
    (the text before the first of `<>=!` is not one of KEYS)."""
    if not part:
        return True
    end = min((i for i in (part.find(c) for c in "<>=!") if i >= 0), default=-1)
    return end >= 0 and part[:end] not in KEYS


def parse_requirement(
    expr: str, *, source: str = "--require-cuda", skip_unknown: bool = False
) -> list[list[tuple[str, str, str]]]:
    """NVIDIA requirement expression -> alternatives (ORed) of (key, op, value) constraints (ANDed).

    InputError names `source` and the malformed constraint. With `skip_unknown` (the container gate:
    NVIDIA's toolkit's own rule) empty constraints and unknown properties are skipped, and an
    alternative left empty is dropped; [] then means no requirement."""
    alternatives: list[list[tuple[str, str, str]]] = []
    for alt in expr.split():
        constraints = []
        for part in alt.split(","):
            if skip_unknown and _unknown_property(part):
                continue
            found = split_constraint(part)
            if found is None:
                raise InputError(
                    f"{source}: malformed constraint {part!r} "
                    "(expected e.g. cuda>=12.2 or brand=tesla,driver>=470)"
                )
            key, op, value = found
            if key != "brand" and not is_version(value):
                raise InputError(f"{source}: {key} needs a version, got {part!r}")
            if key == "brand" and op not in ("=", "==", "!="):
                raise InputError(f"{source}: brand compares with = or != only, got {part!r}")
            constraints.append((key, op, value))
        if constraints:
            alternatives.append(constraints)
    if not alternatives and not skip_unknown:
        raise InputError(f"{source}: empty requirement")
    return alternatives


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)), b + (0,) * (n - len(b))


def _holds(key: str, op: str, value: str, facts: dict[str, str | None]) -> bool:
    have = facts.get(key)
    if have is None:
        return False
    if key == "brand":
        same = have.lower() == value.lower()
        return not same if op == "!=" else same
    x, y = _pad(vkey(have), vkey(value))
    return {
        ">=": x >= y, "<=": x <= y, ">": x > y, "<": x < y, "=": x == y, "==": x == y, "!=": x != y,
    }[op]


def requirement_met(
    alternatives: list[list[tuple[str, str, str]]], facts: dict[str, str | None]
) -> bool:
    """True when some alternative has all of its constraints hold for `facts` (pure)."""
    return any(all(_holds(k, op, v, facts) for k, op, v in alt) for alt in alternatives)


def validate_requirement(requirement: str, *, source: str = "--require-cuda") -> None:
    """InputError unless `requirement` is a known CUDA version or a well-formed expression."""
    if cuda_release(requirement.strip()):
        parse_cuda(requirement)
    else:
        parse_requirement(requirement, source=source)


def check_requirement(
    requirement: str, driver: str, *, source: str = "--require-cuda"
) -> tuple[bool, str]:
    """(ok, one-line message): can CUDA applications requiring `requirement` run on `driver`?

    A bare version ("12.2") is the toolkit-table check (`check`); anything else is an NVIDIA
    requirement expression. InputError for a malformed requirement."""
    if cuda_release(requirement.strip()):
        return check(requirement, driver)
    alternatives = parse_requirement(requirement, source=source)
    supported = max_cuda(driver)
    facts: dict[str, str | None] = {"driver": driver, "cuda": supported, "brand": None, "arch": None}
    ok = requirement_met(alternatives, facts)
    cuda_needs = [f"{k}{op}{v}" for alt in alternatives for k, op, v in alt if k == "cuda"]
    if cuda_needs:
        wanted = f"CUDA {cuda_needs[0].removeprefix('cuda')}"
    else:
        wanted = ",".join("".join(c) for c in alternatives[0])
    have = f"driver {driver} supports up to CUDA {supported or 'none'}"
    if ok:
        return True, f"{source}: {wanted} satisfied: {have}"
    return False, f"{source} requires {wanted}, but {have}"


# NVML brands (lower case, as NVIDIA_REQUIRE_* spells them) of the GPUs CUDA forward compatibility
# supports: NVIDIA's data center GPUs ("Tesla" up to Ampere, "NVIDIA" after). Consumer and workstation
# brands (geforce, geforcertx, titan, quadro, nvidiartx, ...) fail with CUDA error 804 on a newer
# compat libcuda (docs.nvidia.com/deploy/cuda-compatibility, "Forward Compatibility").
FORWARD_COMPAT_BRANDS = frozenset({"tesla", "nvidia"})


def forward_compatible(gpus: list[dict[str, str | None]]) -> bool:
    """True when there are GPU facts and every GPU's brand supports CUDA forward compatibility."""
    return bool(gpus) and all(str(g.get("brand") or "").lower() in FORWARD_COMPAT_BRANDS for g in gpus)


def requirements_hold(
    requirements: list[list[list[tuple[str, str, str]]]], driver: str, gpus: list[dict[str, str | None]]
) -> bool:
    """NVIDIA's rule for a container's NVIDIA_REQUIRE_* (each parsed by parse_requirement): every one
    must hold (AND) for every GPU's facts (brand, arch; none known: a constraint on them never
    holds), with `driver` and the newest CUDA it supports (pure)."""
    base: dict[str, str | None] = {"driver": driver, "cuda": max_cuda(driver), "brand": None, "arch": None}
    facts = [{**base, "brand": g.get("brand"), "arch": g.get("arch")} for g in gpus] or [base]
    return all(requirement_met(alts, f) for alts in requirements if alts for f in facts)
