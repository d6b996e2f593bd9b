"""Typed errors. The library raises these; front-ends (CLI, Ansible modules, bootstrap) translate them.

One rule for exit codes: a refused input exits 2 and leaves the system as it was. Refused inputs
are what the user or a store handed nodeprep: an unknown version, an invalid profile field, a
checksum mismatch, a kmod for another kernel or driver version, and every ArtifactError (an unsafe
member, a truncated or corrupt archive, a size over the caps, an incomplete user space). Everything
else exits 1: the node's state (StateError, also "not enough free space"), an unreachable remote,
a failed subprocess. Commands that report checks (doctor, artifacts verify) exit 1 when one fails.
"""

from __future__ import annotations


class NodeprepError(Exception):
    """Base class: one-line message plus an optional hint shown on the next line."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InputError(NodeprepError):
    """The user asked for something that does not exist or is malformed (exit 2).

    `field` (a profile field path, e.g. "driver.version") and `flag` (its command-line option, e.g.
    "--driver") name the input; each front-end renders its own name: the CLI the flag
    (str(), `--driver: ...`), the Ansible modules and bootstrap the field (`field_message()`)."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None, field: str | None = None,
                 flag: str | None = None) -> None:
        self.detail = message
        self.field = field
        self.flag = flag
        name = flag or field
        super().__init__(f"{name}: {message}" if name else message, hint=hint)

    def field_message(self) -> str:
        """The message for front-ends without flags: the field path, else the flag."""
        name = self.field or self.flag
        return f"{name}: {self.detail}" if name else self.detail


class InputFileError(InputError):
    """A file the user gave is malformed; `problems` holds one line per problem, `source` the file."""

    def __init__(self, problems: list[str], *, source: str = "profile", hint: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: " + "; ".join(self.problems), hint=hint)


class ProfileError(InputFileError):
    """The node profile has one or more invalid fields; `problems` holds one line per field."""


class ChecksumError(InputError):
    """Downloaded or stored bytes do not match their expected sha256."""


class ArtifactError(NodeprepError):
    """An artifact is malformed, unsafe, incomplete, too large or fails verification: a refused
    input (exit 2)."""

    exit_code = 2


class StateError(NodeprepError):
    """The node's nodeprep state does not allow the requested operation."""


class StateFileError(StateError):
    """state.json is not what nodeprep writes (not JSON, a field of the wrong type or value): the file
    under --root is refused like any input (exit 2), nothing changed."""

    exit_code = 2


class NetworkError(NodeprepError):
    """A remote (archive, store, metadata service) could not be reached in time."""


class BuildError(NodeprepError):
    """Compiling or smoke-testing kernel modules failed; the hint carries the last error lines."""


class CommandError(NodeprepError):
    """A subprocess failed. str() is one line; `tail` holds the last lines of its output."""

    def __init__(
        self,
        argv: list[str],
        returncode: int,
        *,
        tail: str = "",
        log_path: str | None = None,
        message: str | None = None,
    ) -> None:
        self.argv = argv
        self.returncode = returncode
        self.tail = tail
        self.log_path = log_path
        tool = argv[0] if argv else "?"
        msg = message or f"{tool} failed with exit code {returncode}"
        if log_path:
            msg += f" (full log: {log_path})"
        super().__init__(msg, hint=tail.strip() or None)
