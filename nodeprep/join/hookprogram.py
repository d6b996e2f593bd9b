"""nodeprep's createContainer hook as a program the node owns: /usr/libexec/nodeprep/cdi-hook.

A CDI spec (or any runtime config) that names a hook must name something the node itself has, in an
image built with `--root` as on a live node, whoever ran nodeprep and wherever nodeprep lives later
(a rebuilt venv, an upgrade, a checkout that moved). So the hook is not "this interpreter with this
nodeprep on sys.path": it is one file written under ROOT, atomically, holding the sources of the
modules nodeprep.containerhooks.spec and the gate import, loaded by a small importer on first
import, and run by the node's own /usr/bin/python3 (`-SE`: no site, no PYTHON* variables; no
third-party package). What the node needs: /usr/bin/python3, Python >= MIN_PYTHON; `python_problem`
checks it before a spec naming the program is written. `hook_command()` is the one place that says
how a hook is invoked.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .. import __version__
from ..containerhooks import spec as _spec  # noqa: F401  (its source is the program's)
from .files import FileChange, under

HOOK_PATH = "/usr/libexec/nodeprep/cdi-hook"
PYTHON = "/usr/bin/python3"
MIN_PYTHON = (3, 9)  # the hook's modules use nothing newer (tests/unit/containerhooks/test_hook_program.py)
# What nodeprep.containerhooks.spec and .gate import, themselves included (checked by the test above).
MODULES = ("nodeprep", "nodeprep.containerhooks", "nodeprep.containerhooks.spec",
           "nodeprep.containerhooks.container", "nodeprep.containerhooks.gate",
           "nodeprep.containerhooks.jsonload", "nodeprep.cuda", "nodeprep.errors", "nodeprep.runner")
# The hooks the program runs besides the CDI spec's own (nodeprep.containerhooks.spec), each chosen by a
# first argument (argv[0] is no use: a script started through its #! line sees its own path there):
# the CUDA gate that hooks.d and containerd's base runtime spec run for every container.
ENTRIES = {"gate": "nodeprep.containerhooks.gate"}
PACKAGES = ("nodeprep", "nodeprep.containerhooks")
HEADER = "# Written by nodeprep"
STAMP = "# stamp: "
_LIB_DIRS = ("usr/lib", "usr/lib64", "usr/local/lib")
# Each module's future statement: the bytecode is compiled with its flag instead, so that no start
# imports __future__ (a module read from the standard library's folder: ~0.5-1 ms of CPU per start).
FUTURE = "from __future__ import annotations\n"
_VERSIONED = re.compile(r"python(\d+)\.(\d+)")

_TEMPLATE = '''\
#!{python} -SE
{header} {version}: nodeprep's createContainer hooks (the CDI spec's, the CUDA gate),
# self-contained so that it runs with this node's {python} alone. Rewritten by nodeprep; do not edit.
{stamp_prefix}{stamp}
import sys

PACKAGES = {packages!r}
MODULES = {modules!r}
# The modules' sources, and the same compiled by the interpreter that wrote this file (used where the
# magic number matches: compiling the sources on every container start costs more than the rest of
# the hook), each zlib-compressed and base64-encoded: one plain string is what costs the least to
# parse at every start, and only the modules a hook imports are decoded.
SOURCES = {sources!r}
MAGIC = {magic!r}
CODE = {code!r}


def _unpack(text):
    import binascii
    import zlib

    return zlib.decompress(binascii.a2b_base64(text))


def _code(name, origin):
    if getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None) == MAGIC:
        import marshal

        return marshal.loads(_unpack(CODE[name]))
    return compile(_unpack(SOURCES[name]).decode(), origin, "exec", dont_inherit=True)


class _Importer:
    """Finds and loads the modules above from SOURCES (meta path finder and loader)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in MODULES:
            return None
        return type(sys.__spec__)(name, _Importer, origin={origin!r} + name, is_package=name in PACKAGES)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        exec(_code(module.__spec__.name, module.__spec__.origin), module.__dict__)


sys.meta_path.insert(0, _Importer)
ENTRIES = {entries!r}
_entry = "nodeprep.containerhooks.spec"
if sys.argv[1:2] and sys.argv[1] in ENTRIES:
    _entry = ENTRIES[sys.argv.pop(1)]
sys.exit(__import__(_entry, fromlist=["main"]).main())
'''


def hook_command(entry: str | None = None) -> tuple[str, list[str], list[str]]:
    """(path, argv, env) of nodeprep's container hook as the node runs it: the program at HOOK_PATH
    (written by `hook_program`), the CDI spec's hook or, with `entry`, one of ENTRIES; arguments
    appended by the caller."""
    if entry is not None and entry not in ENTRIES:
        raise ValueError(f"no hook {entry!r} in the hook program")
    return HOOK_PATH, [Path(HOOK_PATH).name, *([entry] if entry else [])], []


def _source(module: object) -> str:
    spec = module.__spec__  # type: ignore[attr-defined]
    text = spec.loader.get_source(spec.name)  # a file, a checkout or the Ansible zipapp alike
    if text is None:  # pragma: no cover - nodeprep always ships its sources
        raise RuntimeError(f"no source for {spec.name}")
    return str(text)


def render_program(on_disk: bytes | None = None) -> bytes:
    """The hook program's bytes (pure apart from reading nodeprep's own sources). `on_disk`, the
    file there now, is kept when its stamp (nodeprep version, sources, writer's magic number) is
    this one's: marshal's output is not byte-stable across processes, the program it holds is."""
    import hashlib
    import marshal
    from importlib.util import MAGIC_NUMBER

    from .. import cuda, errors, runner  # noqa: F401  (the hook imports them lazily; their sources)
    from ..containerhooks import gate  # noqa: F401

    sources = {name: _source(sys.modules[name]) for name in MODULES}
    stamp = hashlib.sha256(repr((__version__, MAGIC_NUMBER, sorted(sources.items()), sorted(ENTRIES.items()),
                                 _TEMPLATE)).encode()).hexdigest()
    if on_disk is not None and f"\n{STAMP}{stamp}\n".encode() in on_disk[:1024]:
        return on_disk
    origin = f"{HOOK_PATH}:"
    code = {name: pack(marshal.dumps(_compile(text, origin + name))) for name, text in sources.items()}
    return _TEMPLATE.format(python=PYTHON, header=HEADER, version=__version__, packages=PACKAGES,
                            modules=MODULES, sources={n: pack(t.encode()) for n, t in sources.items()},
                            magic=MAGIC_NUMBER, code=code, origin=origin, entries=ENTRIES,
                            stamp_prefix=STAMP, stamp=stamp).encode()


def _compile(text: str, filename: str) -> object:
    """A module's bytecode as the program holds it: its future statement (on a line of its own,
    replaced by an empty one: the line numbers stay) given as the compiler flag instead, and without
    docstrings and asserts (optimize=2: less to parse, decompress and unmarshal at each start) (pure)."""
    import __future__

    flags = 0
    if FUTURE in text:
        text, flags = text.replace(FUTURE, "\n", 1), __future__.annotations.compiler_flag
    return compile(text, filename, "exec", flags=flags, dont_inherit=True, optimize=2)


def pack(data: bytes) -> str:
    """How the program holds a module's source or code: zlib, then base64 on one line (pure)."""
    import binascii
    import zlib

    return binascii.b2a_base64(zlib.compress(data, 9), newline=False).decode()


def unpack(text: str) -> bytes:
    """The bytes `pack` packed (the program's own `_unpack`)."""
    import binascii
    import zlib

    return zlib.decompress(binascii.a2b_base64(text))


def hook_program(root: Path) -> FileChange:
    """The hook program under `root` as a planned write (mode 0755)."""
    path = under(root, HOOK_PATH)
    try:
        on_disk: bytes | None = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        on_disk = None
    return FileChange(path, HOOK_PATH, render_program(on_disk), 0o755, program=True)


def python_version(root: Path) -> tuple[int, int] | None:
    """The Python version of ROOT's /usr/bin/python3, from the name it links to (python3.11) or else
    the one standard library under ROOT; None when there is no such interpreter or no telling."""
    path = under(root, PYTHON)
    if not path.is_file():
        return None
    m = _VERSIONED.fullmatch(path.name)
    if m:
        return int(m.group(1)), int(m.group(2))
    found = set()
    for lib in _LIB_DIRS:
        try:
            base = under(root, f"/{lib}")
            entries = list(base.iterdir()) if base.is_dir() else []
        except OSError:
            continue
        for entry in entries:
            m = _VERSIONED.fullmatch(entry.name)
            if m and m.group(1) == "3" and (entry / "os.py").is_file():
                found.add((int(m.group(1)), int(m.group(2))))
    return found.pop() if len(found) == 1 else None


def python_problem(root: Path) -> str | None:
    """Why the node under `root` cannot run the hook program (None: it can)."""
    want = ".".join(map(str, MIN_PYTHON))
    version = python_version(root)
    if version is None:
        where = "" if Path(root) == Path("/") else f" under {root}"
        return (f"{PYTHON}{where}: missing, or its version cannot be told; nodeprep's CDI hook "
                f"({HOOK_PATH}) runs with it and needs Python >= {want}")
    if version < MIN_PYTHON:
        return (f"{PYTHON} is Python {version[0]}.{version[1]}; nodeprep's CDI hook ({HOOK_PATH}) "
                f"needs Python >= {want}")
    return None
