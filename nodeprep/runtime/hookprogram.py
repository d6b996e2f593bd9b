"""nodeprep's createContainer hook as a program the node owns: /usr/libexec/nodeprep/cdi-hook.

A CDI spec (or any runtime config) that names a hook must name something the node itself has, in an
image built with `--root` as on a live node, whoever ran nodeprep and wherever nodeprep lives later
(a rebuilt venv, an upgrade, a checkout that moved). So the hook is not "this interpreter with this
nodeprep on sys.path": it is two files written under ROOT, each atomically, run by the node's own
/usr/bin/python3 (`-IS`: isolated, no site: no PYTHON* variables, neither the working nor the
script's folder on sys.path; no third-party package):

- the program, HOOK_PATH: a small script that loads the modules file beside it, installs an importer
  for the modules in it and runs the entry;
- the modules file, MODULES_PATH: one header, then marshal data (a dict of str and bytes, readable by
  any Python 3) holding the sources of the modules nodeprep.containerhooks.spec and the gate import
  and the same compiled by the interpreter that wrote it, used where the magic number matches.

Two files, not one, because a Python script is parsed whole at every start: the ~75 KB of modules as
string literals cost ~1.4 ms of CPU per container start, marshal data read as bytes ~0.1 ms. Everything
that depends on nodeprep's version is in the modules file, which is written first; the program only
loads it, so a start between the two writes runs one consistent set of modules.
What the node needs: /usr/bin/python3, Python >= MIN_PYTHON; `python_problem` checks it before a spec
naming the program is written. `hook_command()` is the one place that says how a hook is invoked.
"""

from __future__ import annotations
import __future__

import hashlib
import marshal
import re
import sys
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from types import CodeType  # loaded at every interpreter start

from .. import __version__
from ..containerhooks import gate  # noqa: F401
from ..containerhooks import spec as _spec  # noqa: F401  (its source is the program's)
from ..containerhooks.container import HOOK_ENV
from .files import FileChange, under

HOOK_PATH = "/usr/libexec/nodeprep/cdi-hook"
MODULES_SUFFIX = ".modules"
MODULES_PATH = HOOK_PATH + MODULES_SUFFIX  # the program finds it beside itself (its own __file__)
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
DEFAULT_ENTRY = "nodeprep.containerhooks.spec"
PACKAGES = ("nodeprep", "nodeprep.containerhooks")
HEADER = "# Written by nodeprep"
STAMP = "# stamp: "
_LIB_DIRS = ("usr/lib", "usr/lib64", "usr/local/lib")
# Each module's future statement: the bytecode is compiled with its flag instead, so that no start
# imports __future__ (a module read from the standard library's folder: ~0.5-1 ms of CPU per start).
FUTURE = "from __future__ import annotations\n"
_VERSIONED = re.compile(r"python(\d+)\.(\d+)")

_TEMPLATE = '''\
#!{python} -IS
{header} {version}: nodeprep's createContainer hooks (the CDI spec's, the CUDA gate), run by this
# node's {python} alone with the modules in {modules_path}. Rewritten by nodeprep; do not edit.
import marshal
import sys

try:
    with open(__file__ + {suffix!r}, "rb") as _f:
        _raw = _f.read()
    DATA = marshal.loads(_raw[_raw.index(b"\\n\\n") + 2:])  # after the modules file's header
except (OSError, ValueError, EOFError) as e:  # refused, as any hook that cannot decide
    sys.exit(f"nodeprep hook: cannot load {{__file__}}{suffix} ({{e}}); `nodeprep runtime` writes it")


def _code(name, origin):
    if getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None) == DATA["magic"]:
        return marshal.loads(DATA["code"][name])
    return compile(DATA["sources"][name], origin, "exec", dont_inherit=True)


class _Importer:
    """Finds and loads the modules of DATA (meta path finder and loader)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in DATA["sources"]:
            return None
        return type(sys.__spec__)(name, _Importer, origin=__file__ + ":" + name,
                                  is_package=name in DATA["packages"])

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        exec(_code(module.__spec__.name, module.__spec__.origin), module.__dict__)


sys.meta_path.insert(0, _Importer)
_entry = DATA["entry"]
if sys.argv[1:2] and sys.argv[1] in DATA["entries"]:
    _entry = DATA["entries"][sys.argv.pop(1)]
sys.exit(__import__(_entry, fromlist=["main"]).main())
'''


def hook_command(entry: str | None = None) -> tuple[str, list[str], list[str]]:
    """(path, argv, env) of nodeprep's container hook as the node runs it: the program at HOOK_PATH
    (written by `hook_program`), the CDI spec's hook or, with `entry`, one of ENTRIES; arguments
    appended by the caller. `env` is the hook's whole environment (HOOK_ENV), never empty: a hook
    entry without one is started with the container's (its LD_PRELOAD included)."""
    if entry is not None and entry not in ENTRIES:
        raise ValueError(f"no hook {entry!r} in the hook program")
    return HOOK_PATH, [Path(HOOK_PATH).name, *([entry] if entry else [])], hook_env()


def hook_env() -> list[str]:
    """The `env` of every hook entry nodeprep writes (pure)."""
    return [f"{k}={v}" for k, v in HOOK_ENV.items()]


def _source(module: object) -> str:
    spec = module.__spec__  # type: ignore[attr-defined]  # a module's: its loader has get_source
    text = spec.loader.get_source(spec.name)  # a file, a checkout or the Ansible zipapp alike
    if text is None:  # pragma: no cover - nodeprep always ships its sources
        raise RuntimeError(f"no source for {spec.name}")
    return str(text)


def render_program() -> bytes:
    """The program's bytes (pure): the same for every node with this nodeprep version."""
    return _TEMPLATE.format(python=PYTHON, header=HEADER, version=__version__,
                            modules_path=MODULES_PATH, suffix=MODULES_SUFFIX).encode()


def render_modules(on_disk: bytes | None = None) -> bytes:
    """The modules file's bytes (pure apart from reading nodeprep's own sources). `on_disk`, the
    file there now, is kept when its stamp (nodeprep version, sources, writer's magic number) is
    this one's: marshal's output is not byte-stable across processes, the modules it holds are."""
    from .. import cuda, errors, runner  # noqa: F401  (the hook imports them lazily; their sources)

    sources = {name: _source(sys.modules[name]) for name in MODULES}
    stamp = hashlib.sha256(repr((__version__, MAGIC_NUMBER, sorted(sources.items()), sorted(ENTRIES.items()),
                                 DEFAULT_ENTRY, PACKAGES)).encode()).hexdigest()
    header = (f"{HEADER} {__version__}: the modules of {HOOK_PATH} (marshal data after the empty line)."
              f" Rewritten by nodeprep; do not edit.\n{STAMP}{stamp}\n\n").encode()
    if on_disk is not None and on_disk.startswith(header):
        return on_disk
    origin = f"{HOOK_PATH}:"
    data = {"magic": MAGIC_NUMBER, "entry": DEFAULT_ENTRY, "entries": dict(ENTRIES), "packages": PACKAGES,
            "code": {name: marshal.dumps(_compile(text, origin + name)) for name, text in sources.items()},
            "sources": sources}
    return header + marshal.dumps(data, 4)  # version 4: what every Python >= MIN_PYTHON reads


def _compile(text: str, filename: str) -> CodeType:
    """A module's bytecode as the program holds it: its future statement (on a line of its own,
    replaced by an empty one: the line numbers stay) given as the compiler flag instead, and without
    docstrings and asserts (optimize=2: less to unmarshal at each start) (pure)."""
    flags = 0
    if FUTURE in text:
        text, flags = text.replace(FUTURE, "\n", 1), __future__.annotations.compiler_flag
    code: CodeType = compile(text, filename, "exec", flags=flags, dont_inherit=True, optimize=2)
    return code


def read_modules(data: bytes) -> dict[str, object]:
    """What a modules file holds (its marshal data after the header)."""
    modules: dict[str, object] = marshal.loads(data[data.index(b"\n\n") + 2:])
    return modules


def hook_program(root: Path) -> list[FileChange]:
    """The hook program under `root` as planned writes: the modules file (0644), then the program
    (0755) that loads it."""

    def read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    modules = under(root, MODULES_PATH)
    return [FileChange(modules, MODULES_PATH, render_modules(read(modules)), 0o644, program=True),
            FileChange(under(root, HOOK_PATH), HOOK_PATH, render_program(), 0o755, program=True)]


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
