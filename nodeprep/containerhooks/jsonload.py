"""json.loads for the container hooks without importing json (whose decoder imports re: most of a
hook's start-up cost) or anything else: CPython's C scanner (_json) directly. Its own module so that
the CUDA gate decides a container without a GPU before it imports os (nodeprep.containerhooks.gate)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a hook's start-up cost
if TYPE_CHECKING:
    from typing import Any


class _Decoder:
    """What the C scanner of CPython's json accelerator reads from its context (json.JSONDecoder's
    defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity


def loads(text: str) -> Any:  # any JSON value
    """json.loads through CPython's C scanner; the json module where it is missing."""
    try:
        from _json import make_scanner
    except ImportError:  # pragma: no cover - CPython always has it
        import json

        return json.loads(text)
    text = text.lstrip(" \t\n\r")
    try:
        # typeshed's make_scanner wants a make_scanner; the C scanner reads these attributes of any object
        value, end = make_scanner(_Decoder())(text, 0)  # type: ignore[arg-type]
    except StopIteration:
        raise ValueError("not JSON") from None
    except SystemError:  # the scanner's error path wants json.decoder, which is not imported
        raise ValueError("malformed JSON") from None
    if text[end:].strip(" \t\n\r"):
        raise ValueError(f"extra data after position {end}")
    return value


def oci_config(state: str) -> tuple[str, bytes]:
    """(bundle, config.json's bytes) of the OCI state a runtime gives a hook on stdin (no os needed)."""
    bundle = loads(state)["bundle"]
    sep = "/" if bundle and not bundle.endswith("/") else ""
    with open(f"{bundle}{sep}config.json", "rb") as f:
        return bundle, f.read()


def rootfs_of(config: dict[str, Any], bundle: str) -> str:
    """The container's root filesystem: config.json's root.path, relative to the bundle."""
    root = str(config.get("root", {}).get("path", "rootfs"))
    return root if root.startswith("/") else f"{bundle.rstrip('/')}/{root}"
