"""Build matrices: OS releases x kernels x drivers x flavours, from a small YAML file.

    os: [debian-12, debian-13]     # target OSes of nodeprep.targets (default debian-12)
    kernels:                       # default [default]
      - default                    # the OS's current default kernel (main channel; also "latest")
      - 6.1.0-56-amd64             # an exact kernel release
      - {channel: backports}       # the current default kernel of a kernel channel
      - {channel: main, newest: 2} # the 2 newest kernels the channel serves
    drivers: [default, "535", 535.309.01]   # "default"/"latest": the channel's newest driver
    flavours: [proprietary, open]  # default [proprietary]
    exclude:                       # optional: drop cells matching every given key
      - {driver: "535", flavour: open}
    open_source:                   # optional: NVIDIA open-gpu-kernel-modules releases, built for every kernel
      - {release: https://…/open-gpu-kernel-modules-580.142.tar.gz, sha256: 644c…}
    companions:                    # optional: per exact driver version, what its cells build beside it
      "535.309.01":
        persistenced: {url: https://…/nvidia-persistenced-535.309.01.tar.gz, sha256: aa0c…}
        fabricmanager: {url: https://…/fabricmanager-linux-x86_64-535.309.01-archive.tar.xz, sha256: …}
        nvidia_fs: {url: https://…/gds-nvidia-fs-2.28.4.tar.gz, sha256: …}
        gdrcopy: {url: https://…/gdrcopy-2.6.tar.gz, sha256: …}

The file is checked against `json_schema()` (built from the same vocabularies the CLI uses: the
target OSes, their kernel channels, the flavours, the driver spelling); every problem is one
`field: message` of an InputFileError naming the file. `Matrix.cells()` gives the cells as written
(no archive needed); `expand()` resolves them against each OS's archive to the cells that exist
(exact kernel releases, exact driver versions) and the refused ones with their reason.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import jsonschema

from .. import targets
from ..errors import InputError, InputFileError
from ..node.branch import Candidate, choose, gpu_ids
from ..sources import drivers as driver_sources
from ..sources import opensource
from ..sources.debian import DebianArchive
from ..targets import limits
from ..vocab import DRIVER_REQUEST_RE, DRIVER_VERSION_RE, FLAVOURS, KERNEL_RELEASE_RE
from ..yamlinput import Document, load_yaml, parse_yaml
from . import fabricmanager, headers
from .resolve import BuildRequest
from .userspace import supported_gpus

DEFAULT = ("default", "latest")
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "data" / "matrix.schema.json"
EXCLUDE_KEYS = ("os", "driver", "kernel", "flavour")
SHA256_PATTERN = "^[0-9a-fA-F]{64}$"
# companions: key -> build-driver's flag (its sha256 flag is FLAG-sha256, but --persistenced-source's)
COMPANION_FLAGS = {"persistenced": ("--persistenced-source", "--persistenced-sha256"),
                   "fabricmanager": ("--fabricmanager", "--fabricmanager-sha256"),
                   "nvidia_fs": ("--nvidia-fs", "--nvidia-fs-sha256"),
                   "gdrcopy": ("--gdrcopy", "--gdrcopy-sha256")}


class MatrixError(InputFileError):
    """The matrix file has one or more invalid fields; `problems` holds one line per field."""


# ---------------------------------------------------------------------------------------------
# The file's schema (vocabularies from nodeprep.targets and nodeprep.sources.drivers)


def _channels() -> list[str]:
    return sorted({c.name for t in targets.all_targets() for c in t.channels})


def json_schema() -> dict[str, Any]:
    """JSON Schema of a matrix file. `x-message` is the message nodeprep gives for a value that
    fails there (after the field's path; `{value}` is the value)."""
    known = ", ".join(targets.names())
    os_name = {"enum": targets.names(), "x-message": f"unknown OS {{value}} (known: {known})"}
    driver = {
        "anyOf": [
            {"type": "string", "pattern": DRIVER_REQUEST_RE.pattern},
            {"enum": list(DEFAULT)},
            {"type": "integer", "minimum": 100, "maximum": 999},
        ],
        "x-message": "{value} is not a driver version or branch (or 'default')",
    }
    channels, flavours = ", ".join(_channels()), ", ".join(FLAVOURS)
    kernel = {
        "anyOf": [
            {"enum": list(DEFAULT)},
            {"type": "string", "pattern": KERNEL_RELEASE_RE.pattern},
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "channel": {"enum": _channels(),
                                "x-message": f"{{value}} is not a kernel channel ({channels})"},
                    "newest": {"type": "integer", "minimum": 1,
                               "x-message": "must be a whole number of at least 1"},
                    "default": {"const": True, "x-message": "must be true (or use newest: N)"},
                },
                "not": {"required": ["newest", "default"]},
                "x-message": "takes newest: N or default: true, not both",
            },
        ],
        "x-message": "{value} is not a kernel release, 'default' or {{channel: NAME, newest: N}}",
    }

    def listed(item: dict[str, Any], what: str) -> dict[str, Any]:
        return {"type": "array", "minItems": 1, "items": item, "x-message": "must be a non-empty list",
                "description": what}

    pinned = {
        "type": "object",
        "additionalProperties": False,
        "required": ["url", "sha256"],
        "properties": {
            "url": {"type": "string", "minLength": 1, "pattern": "^[^\\x00-\\x1f\\x7f]+$",
                    "x-message": "must be the file's URL or path (one line)"},
            "sha256": {"type": "string", "pattern": SHA256_PATTERN,
                       "x-message": "{value} is not a sha256 hex digest (64 hex digits)"},
        },
        "x-message": "must be a mapping {{url: URL or path, sha256: HEX}}",
    }
    companion_keys = ", ".join(COMPANION_FLAGS)
    exclude_entry = "must be a list of mappings like {{driver: ..., kernel: ..., flavour: ...}}"
    release_entry = "must be a list of mappings like {{release: URL or path, sha256: HEX}}"
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://nodeprep.invalid/schemas/matrix.schema.json",
        "title": "nodeprep build matrix",
        "type": "object",
        "x-message": "must be a mapping with os, kernels, drivers, flavours",
        "additionalProperties": False,
        "properties": {
            "os": {"anyOf": [os_name, listed(os_name, "")], "x-message": os_name["x-message"],
                   "description": "target OS releases (one name or a list)", "default": targets.DEFAULT},
            "kernels": listed(kernel, "kernel releases or selectors of a kernel channel"),
            "drivers": listed(driver, "driver versions, branches, or default"),
            "flavours": listed({"enum": list(FLAVOURS), "x-message": f"{{value}} is not one of {flavours}"},
                               "module flavours"),
            "exclude": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {k: {"type": ["string", "integer"]} for k in EXCLUDE_KEYS},
                    "x-message": exclude_entry,
                },
                "x-message": exclude_entry,
            },
            "open_source": {
                "type": "array",
                "description": "NVIDIA open-gpu-kernel-modules releases (the open flavour) built for "
                               "every kernel",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["release", "sha256"],
                    "properties": {
                        "release": {"type": "string", "minLength": 1,
                                    "x-message": "must be the release tarball's URL or path"},
                        "sha256": {"type": "string", "pattern": SHA256_PATTERN,
                                   "x-message": "{value} is not a sha256 hex digest (64 hex digits)"},
                    },
                    "x-message": release_entry,
                },
                "x-message": release_entry,
            },
            "companions": {
                "type": "object",
                "description": "per exact driver version: persistenced's source, Fabric Manager's archive, "
                               "nvidia-fs's and gdrcopy's releases, built into that driver's artifacts",
                "propertyNames": {"pattern": DRIVER_VERSION_RE.pattern,
                                  "x-message": "{value} is not an exact driver version (e.g. 535.309.01)"},
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": False,
                    "minProperties": 1,
                    "properties": dict.fromkeys(COMPANION_FLAGS, pinned),
                    "x-message": f"must be a mapping with any of {companion_keys}",
                },
                "x-message": "must be a mapping of driver versions",
            },
        },
    }


def render_schema() -> str:
    """The schema as published at nodeprep/data/matrix.schema.json (a test keeps it in step)."""
    return json.dumps(json_schema(), indent=2) + "\n"


def _path_text(path: Any) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


def _leaves(error: Any) -> Iterator[Any]:
    """The errors that say what is wrong: inside anyOf, those of the one branch the value's type
    fits (none or several: the anyOf itself)."""
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict[Any, list[Any]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        fitting = [errs for errs in branches.values()
                   if not any(e.validator in ("type", "enum", "const") and not e.relative_path for e in errs)]
        if len(fitting) == 1:
            for sub in fitting[0]:
                yield from _leaves(sub)
            return
    yield error


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _messages(error: Any) -> Iterator[tuple[list[Any], str]]:
    """(path, message) for one schema error."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        props = error.schema.get("properties", {})
        for k in sorted(set(error.instance) - set(props), key=str):
            yield [*path, k], f"unknown key (known: {', '.join(props)})"
        return
    holder = error
    while holder is not None and "x-message" not in holder.schema:  # the nearest one that says
        holder = holder.parent
    text = holder.schema["x-message"] if holder is not None else None
    yield path, text.format(value=_show(error.instance)) if text else error.message


def validate(data: Any, document: Document | None = None) -> list[str]:
    """One `field: message` per problem of the parsed matrix file `data` (empty: valid); with the
    line when `document` is the parsed file."""
    validator = jsonschema.Draft202012Validator(json_schema())
    problems: list[str] = []
    for error in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        for leaf in _leaves(error):
            for path, text in _messages(leaf):
                line = document.line(*path) if document is not None and path else None
                msg = (f"{_path_text(path)}: " if path else "") + text + (f" (line {line})" if line else "")
                if msg not in problems:
                    problems.append(msg)
    return problems


# ---------------------------------------------------------------------------------------------
# The parsed matrix


@dataclass(frozen=True)
class KernelSpec:
    """One entry of `kernels:`: an exact release, or the default / newest N of a channel."""

    release: str | None = None
    channel: str | None = None  # None: the OS's main (first) channel
    newest: int | None = None

    @property
    def needs_archive(self) -> bool:
        return self.release is None and (self.channel is not None or self.newest is not None)

    def text(self) -> str:
        if self.release:
            return self.release
        what = f"newest={self.newest}" if self.newest else "default"
        return f"{self.channel}:{what}" if self.channel else what


@dataclass(frozen=True)
class Cell:
    os: str
    driver: str | None  # None: newest served
    flavour: str
    kernel: str | None  # None: the OS's default kernel
    channel: str | None = None  # expanded cells: the kernel channel
    source: str | None = None  # expanded cells: the Debian driver source package=version
    open_source: str | None = None  # an open-gpu-kernel-modules release (URL or path) instead of Debian's
    open_source_sha256: str | None = None
    # (companions key, URL or path, sha256): what the matrix's `companions` gives this cell's driver
    companions: tuple[tuple[str, str, str], ...] = ()

    def args(self) -> list[str]:
        out = ["--os", self.os, "--flavour", self.flavour]
        if self.open_source:
            out += ["--open-source", self.open_source, "--open-source-sha256", self.open_source_sha256 or ""]
        elif self.driver:
            out += ["--driver", self.driver]
        if self.kernel:
            out += ["--kernel", self.kernel]
        for key, url, sha in self.companions:
            flag, sha_flag = COMPANION_FLAGS[key]
            out += [flag, url, sha_flag, sha]
        return out

    def name(self) -> str:
        return f"{self.os} {self.kernel or 'default'} {self.driver or 'default'} {self.flavour}"

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v is not None or k in ("driver", "kernel")}
        return data | {"name": self.name(), "args": self.args()}

    def request(self, **common: Any) -> Any:
        """The resolve.BuildRequest of this cell (its OS resolved here), with the options `common`
        every cell of the build shares (store, cache, jobs, rebuild, userspace, smoke_test)."""
        given = {key: (url, sha) for key, url, sha in self.companions}
        persistenced, fm = given.get("persistenced", (None, None)), given.get("fabricmanager", (None, None))
        modules = tuple((name, *given[key])
                        for key, name in (("nvidia_fs", "nvidia-fs"), ("gdrcopy", "gdrdrv")) if key in given)
        return BuildRequest(driver=self.driver, flavour=self.flavour, target=targets.get(self.os),
                            kernel=self.kernel, open_source=self.open_source,
                            open_source_sha256=self.open_source_sha256,
                            persistenced_source=persistenced[0], persistenced_sha256=persistenced[1],
                            fabricmanager=fm[0], fabricmanager_sha256=fm[1], companions=modules, **common)


def build_work(cells: list[Cell], jobs: int, cpus: int, **common: Any) -> list[tuple[dict[str, Any], Any]]:
    """`build-matrix --build`: the (cell description, BuildRequest) of every cell for
    parallel.build_cells, `jobs` cells at a time sharing `cpus` compile jobs."""
    per_cell = max(1, cpus // jobs)
    return [(cell.to_dict(), cell.request(jobs=per_cell, **common)) for cell in cells]


@dataclass(frozen=True)
class Refusal:
    """A cell that cannot exist, and why."""

    os: str
    kernel: str
    driver: str
    flavour: str
    reason: str

    def line(self) -> str:
        return f"refused: {self.os} {self.kernel} {self.driver} {self.flavour}: {self.reason}"


@dataclass(frozen=True)
class OpenRelease:
    """One `open_source:` entry: the release (URL or path), its sha256, the version its name carries."""

    release: str
    sha256: str
    version: str

    @property
    def name(self) -> str:
        return opensource.release_name(self.release)

    def cell(self, os_name: str, kernel: str | None, channel: str | None = None) -> Cell:
        return Cell(os=os_name, driver=self.version, flavour="open", kernel=kernel, channel=channel,
                    source=f"open-source:{self.name}" if channel else None, open_source=self.release,
                    open_source_sha256=self.sha256)


@dataclass(frozen=True)
class Matrix:
    oses: tuple[str, ...]
    kernels: tuple[KernelSpec, ...]
    drivers: tuple[str | None, ...]
    flavours: tuple[str, ...]
    exclude: tuple[dict[str, str], ...] = ()
    source: str = "matrix"
    open_sources: tuple[OpenRelease, ...] = ()
    # driver version -> ((companions key, URL or path, sha256), ...)
    companions: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = ()

    def with_companions(self, cell: Cell) -> Cell:
        """`cell` with what `companions` gives its exact driver version (none: as it is)."""
        found = dict(self.companions).get(cell.driver or "")
        return replace(cell, companions=found) if found else cell

    @property
    def needs_archive(self) -> bool:
        return any(k.needs_archive for k in self.kernels)

    def excluded(self, **values: tuple[str, ...]) -> bool:
        """True when an exclude entry matches: every key it names equals one spelling of the cell's
        value (as written in the file, or as resolved)."""
        return any(all(str(v) in values.get(k, ()) for k, v in e.items()) for e in self.exclude)

    def cells(self) -> list[Cell]:
        """The cells as written (build-driver resolves each one); InputError when a kernel
        selector needs the archive (`expand`)."""
        if self.needs_archive:
            picked = next(k.text() for k in self.kernels if k.needs_archive)
            raise InputError(f"{self.source}: kernels: {picked!r} is resolved against the archive: "
                             "use --expand")
        out: list[Cell] = []
        for os_name, k, d, f in itertools.product(self.oses, self.kernels, self.drivers, self.flavours):
            cell = Cell(os=os_name, driver=d, flavour=f, kernel=k.release)
            spell = {"os": (os_name,), "driver": (d or "latest", d or "default"),
                     "kernel": (k.release or "latest", k.release or "default"), "flavour": (f,)}
            if not self.excluded(**spell) and cell not in out:
                out.append(cell)
        for os_name, k, rel in itertools.product(self.oses, self.kernels, self.open_sources):
            if rel.cell(os_name, k.release) not in out:
                out.append(rel.cell(os_name, k.release))
        return [self.with_companions(c) for c in out]


def _kernel_spec(value: Any) -> KernelSpec:
    if isinstance(value, dict):
        return KernelSpec(channel=value.get("channel"), newest=value.get("newest"))
    return KernelSpec() if value in DEFAULT else KernelSpec(release=str(value))


def from_data(data: Any, *, source: str = "matrix", document: Document | None = None) -> Matrix:
    """A Matrix from the parsed file; MatrixError listing every problem otherwise."""
    if data is None:
        data = {}
    problems = validate(data, document)
    if problems:
        raise MatrixError(problems, source=source, hint="see docs/build.md, Build matrices")
    oses = data.get("os", targets.DEFAULT)
    return Matrix(
        oses=tuple([oses] if isinstance(oses, str) else oses),
        kernels=tuple(_kernel_spec(k) for k in data.get("kernels", ["default"])),
        drivers=tuple(dict.fromkeys(None if d in DEFAULT else str(d)
                                    for d in data.get("drivers", ["default"]))),
        flavours=tuple(dict.fromkeys(data.get("flavours", ["proprietary"]))),
        exclude=tuple(data.get("exclude", []) or []),
        source=source,
        open_sources=_open_releases(data.get("open_source") or [], source),
        companions=_companions(data.get("companions") or {}, source),
    )


def _companions(entries: dict[str, dict[str, dict[str, str]]],
                source: str) -> tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...]:
    """The `companions:` entries, checked beyond the schema: persistenced's source and Fabric Manager's
    archive carry a version in their names, which must be the entry's driver version."""
    out, problems = [], []
    for version, given in entries.items():
        for key in ("persistenced", "fabricmanager"):
            if key not in given:
                continue
            url = given[key]["url"]
            name = Path(unquote(urlparse(url).path)).name
            if key == "persistenced":
                named = opensource.name_version(name, "nvidia-persistenced")
                expected = "nvidia-persistenced-<version>.tar.gz"
            else:
                found = fabricmanager.name_version(name)
                named = found[1] if found else None
                expected = "fabricmanager-linux-<arch>-<version>-archive.tar.xz"
            if named is None:
                problems.append(f"companions.{version}.{key}.url: {url!r} is not named {expected}")
            elif named != version:
                problems.append(f"companions.{version}.{key}.url: {name} is version {named}, not the "
                                f"driver's {version} (it must be the driver's exact version)")
        out.append((version, tuple((key, given[key]["url"], given[key]["sha256"].lower())
                                   for key in COMPANION_FLAGS if key in given)))
    if problems:
        raise MatrixError(problems, source=source, hint="see docs/build.md, Build matrices")
    return tuple(out)


def _open_releases(entries: list[dict[str, str]], source: str) -> tuple[OpenRelease, ...]:
    """The `open_source:` entries, each with the version its file name carries (build-driver checks
    it against the tarball's own)."""
    out, problems = [], []
    for i, e in enumerate(entries):
        try:
            name = opensource.release_name(e["release"])
        except InputError:
            name = ""
        version = opensource.name_version(name)
        if version is None:
            problems.append(f"open_source[{i}].release: {e['release']!r} is not named "
                            "open-gpu-kernel-modules-<version>.tar.gz (an NVIDIA release)")
        else:
            out.append(OpenRelease(e["release"], e["sha256"].lower(), version))
    if problems:
        raise MatrixError(problems, source=source, hint="see docs/build.md, Build matrices")
    return tuple(out)


def parse(text: str, *, source: str = "matrix") -> Matrix:
    doc = parse_yaml(text, source=source, error=MatrixError)
    return from_data(doc.data, source=source, document=doc)


def load(path: Path) -> Matrix:
    """Read (bounded, duplicate keys refused: nodeprep.yamlinput) and check a matrix file."""
    _, doc = load_yaml(Path(path), error=MatrixError)
    return from_data(doc.data, source=str(path), document=doc)


# ---------------------------------------------------------------------------------------------
# Expansion against the archive


ArchiveFor = Callable[[str, str], Any]  # (OS name, channel name) -> its DebianArchive
# (OS name, channel name, driver version) -> that driver's supported-gpus.json, None when unknown
GpuLists = Callable[[str, str, str], str | None]


@dataclass(frozen=True)
class FollowGpus:
    """`build-matrix --gpus`: each kernel's driver and flavour chosen for these GPUs (node.branch)."""

    gpus: tuple[str, ...]
    lists: GpuLists
    policy: str = "newest"


def follow_gpus(gpus: str, archive_for: ArchiveFor, policy: str) -> FollowGpus:
    """`--gpus node|10de:DEVICE,...` (node: this machine's NVIDIA GPUs) over the real archives'
    supported-GPU lists."""
    return FollowGpus(tuple(gpu_ids(Path("/"), gpus)), gpu_lists(archive_for), policy)


@dataclass
class Expansion:
    cells: list[Cell] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    def refuse(self, refusal: Refusal) -> None:
        if refusal not in self.refused:
            self.refused.append(refusal)

    def to_json(self) -> dict[str, Any]:
        """GitHub Actions' `strategy.matrix` shape: `{"include": [cell, ...]}`."""
        return {"include": [c.to_dict() for c in self.cells]}

    def by_kernel(self) -> list[dict[str, Any]]:
        """Per OS and kernel, in the order met: the sources that build for it (`builds`: Debian's
        package=version or open-source:<release>, with driver and flavour) and the refused ones with
        their reason; a kernel refused as a whole has no builds and one refusal."""
        table: dict[tuple[str, str], dict[str, Any]] = {}
        for c in self.cells:
            row = table.setdefault((c.os, str(c.kernel)), {"os": c.os, "kernel": c.kernel, "builds": [],
                                                           "refused": []})
            row["builds"].append({"driver": c.driver, "flavour": c.flavour, "source": c.source})
        for r in self.refused:
            row = table.setdefault((r.os, r.kernel), {"os": r.os, "kernel": r.kernel, "builds": [],
                                                      "refused": []})
            row["refused"].append({"driver": r.driver, "flavour": r.flavour, "reason": r.reason})
        return list(table.values())


def expand(matrix: Matrix, archive_for: ArchiveFor, *, arch: str = "amd64",
           follow: FollowGpus | None = None) -> Expansion:
    """The cells of `matrix` that exist in the archives `archive_for` gives (kernels and drivers
    resolved to exact releases and versions), and the refused ones with their reason. With `follow`,
    each kernel gets the one driver and flavour its line serves for those GPUs instead of the
    matrix's drivers and flavours."""
    out = Expansion()
    catalogs: dict[tuple[str, str], dict[str, list[str]]] = {}

    def catalog(source_os: Any, line: Any) -> dict[str, list[str]]:
        key = (source_os.name, line.name)
        if key not in catalogs:
            catalogs[key] = driver_sources.load_catalog(
                archive_for(*key), driver_sources.source_packages(source_os))
        return catalogs[key]

    for os_name in matrix.oses:
        target = targets.get(os_name)  # the file's OS names are checked by its schema
        for spec in matrix.kernels:
            kernels, why = _kernels(target, spec, archive_for, arch)
            if why:  # no kernel: one refusal for every driver and flavour of it
                out.refuse(Refusal(os_name, spec.text(), "*", "*", why))
                continue
            if follow is not None:
                for kernel, channel in kernels:
                    cell, reason = _gpu_cell(target, kernel, channel, follow, catalog)
                    if reason:
                        out.refuse(Refusal(os_name, kernel, "*", "*", reason))
                    elif cell is not None and cell not in out.cells:
                        out.cells.append(cell)
                continue
            for (kernel, channel), rel in itertools.product(kernels, matrix.open_sources):
                if why := limits.refusal(rel.version, "open", kernel):
                    out.refuse(Refusal(os_name, kernel, rel.name, "open", why))
                elif rel.cell(os_name, kernel, channel.name) not in out.cells:
                    out.cells.append(rel.cell(os_name, kernel, channel.name))
            product = itertools.product(kernels, matrix.flavours, matrix.drivers)
            for (kernel, channel), flavour, driver in product:
                spell = {"os": (os_name,), "kernel": (kernel, spec.text()), "flavour": (flavour,),
                         "driver": (driver or "default", driver or "latest")}
                if matrix.excluded(**spell):
                    continue
                cell, reason = _cell(target, kernel, channel, driver, flavour, catalog)
                if reason:
                    out.refuse(Refusal(os_name, kernel, driver or "default", flavour, reason))
                elif cell is not None and not matrix.excluded(**spell | {"driver": (str(cell.driver),)}) \
                        and cell not in out.cells:
                    out.cells.append(cell)
    out.cells = [matrix.with_companions(c) for c in out.cells]
    return out


def _kernels(target: targets.TargetOS, spec: KernelSpec, archive_for: ArchiveFor,
             arch: str) -> tuple[list[tuple[str, Any]], str | None]:
    """([(kernel release, its channel)], None) for one kernels entry of one OS, or ([], why not)."""
    os_name = target.name
    if spec.release is not None:
        try:
            channel = target.channel_for(spec.release)
        except ValueError as e:
            return [], str(e)
    else:
        try:
            channel = target.channel_named(spec.channel) if spec.channel else target.channels[0]
        except ValueError as e:
            return [], str(e)
    if target.borrows_sources or not target.suite:
        if spec.release is None:
            return [], f"{os_name} has no kernel archive nodeprep can reach: name its kernels explicitly"
        return [(spec.release, channel)], None  # the kernel's own image provides the headers
    archive = archive_for(os_name, channel.name)
    names = archive.packages(r"^linux-headers-[0-9]")
    where = f"{os_name} {channel.name} ({', '.join(channel.suites)})"
    if spec.release is not None:
        if f"linux-headers-{spec.release}" in names and archive.versions(f"linux-headers-{spec.release}"):
            return [(spec.release, channel)], None
        newest = ", ".join(headers.served_releases(archive, arch=arch, names=names, match=channel.matches,
                                                   limit=3)) or "none"
        return [], f"no headers for kernel {spec.release} in the archive of {where} (newest: {newest})"
    if spec.newest is not None:
        found = headers.served_releases(archive, arch=arch, names=names, match=channel.matches,
                                        limit=spec.newest)
        if not found:
            return [], f"the archive of {where} serves no {arch} kernel of that channel"
        return [(r, channel) for r in found], None
    try:
        default = headers.current_default(archive, arch=arch, names=names)
    except InputError as e:
        return [], str(e)
    if not channel.matches(default):
        return [], f"the default kernel of {where} is {default}, not a kernel of that channel"
    return [(default, channel)], None


def _cell(target: targets.TargetOS, kernel: str, channel: Any, driver: str | None, flavour: str,
          catalog: Callable[[Any, Any], dict[str, list[str]]]) -> tuple[Cell | None, str | None]:
    """The cell for an existing kernel, or why it is refused (the driver is not served for that
    kernel's line, the branch has no open modules, a known build failure)."""
    if driver is not None and (why := limits.refusal(driver, flavour, kernel)):
        return None, why
    source_os, line, described = driver_sources.source_line(target, kernel, channel)
    try:
        src = driver_sources.resolve_in_line(catalog(source_os, line), driver, flavour,
                                             version_tag=line.driver_version_tag, line=described)
    except InputError as e:
        return None, str(e).split(": ", 1)[1] if str(e).startswith("--") else str(e)
    if why := limits.refusal(src.driver_version, flavour, kernel):
        return None, why
    return Cell(os=target.name, driver=src.driver_version, flavour=flavour, kernel=kernel,
                channel=channel.name, source=f"{src.package}={src.debian_version}"), None


def _gpu_cell(target: targets.TargetOS, kernel: str, channel: Any, follow: FollowGpus,
              catalog: Callable[[Any, Any], dict[str, list[str]]]) -> tuple[Cell | None, str | None]:
    """The cell whose driver and flavour nodeprep.node.branch chooses for `follow.gpus` among the
    drivers the kernel's line serves (less the known build failures), or why there is none."""
    source_os, line, _ = driver_sources.source_line(target, kernel, channel)
    cat = catalog(source_os, line)
    if line.driver_version_tag:
        cat = {p: [v for v in vs if line.driver_version_tag in v] for p, vs in cat.items()}
    sources: dict[tuple[str, str], driver_sources.DriverSource] = {
        (s.driver_version, s.flavour): s for s in driver_sources.served(cat)
        if not limits.refusal(s.driver_version, s.flavour, kernel)}
    candidates = []
    for version in dict.fromkeys(v for v, _ in sources):
        text = follow.lists(target.name, channel.name, version)
        if text is not None:
            flavours = tuple(f for v, f in sources if v == version)
            candidates.append(Candidate(version, flavours, text))
    try:
        choice = choose(candidates, follow.gpus, policy=follow.policy)
    except InputError as e:
        return None, str(e).removeprefix("--gpus: ")
    src = sources[choice.version, choice.flavour]
    return Cell(os=target.name, driver=choice.version, flavour=choice.flavour, kernel=kernel,
                channel=channel.name, source=f"{src.package}={src.debian_version}"), None


def gpu_lists(archive_for: ArchiveFor) -> GpuLists:
    """`GpuLists` over the real archives (builder.userspace.supported_gpus, one package per version)."""
    made: dict[tuple[str, str, str], str | None] = {}

    def lists(os_name: str, channel: str, version: str) -> str | None:
        if (os_name, channel, version) not in made:
            made[os_name, channel, version] = supported_gpus(archive_for(os_name, channel), version)
        return made[os_name, channel, version]

    return lists


def archives(cache: Path, *, arch: str = "amd64") -> ArchiveFor:
    """`archive_for` over the real archive: one DebianArchive per (OS, channel), with its apt lists
    under `<cache>/apt/` (the same lists build-driver reads, refreshed when older than an hour)."""
    made: dict[tuple[str, str], Any] = {}

    def archive_for(os_name: str, channel: str) -> Any:
        if (os_name, channel) not in made:
            made[os_name, channel] = DebianArchive(cache, os_name=os_name, arch=arch, channel=channel)
        return made[os_name, channel]

    return archive_for
