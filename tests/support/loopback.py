"""A guard that keeps a test on loopback: every connection or name lookup the process attempts is
recorded, and one that is not loopback fails with an AssertionError before any packet leaves. A
test can then assert that nodeprep refused an address without trying it (nothing recorded for it),
or that a flag lets nodeprep try it (recorded, and stopped here)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def guard(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Installs the guard for one test (undone with `monkeypatch`); returns the list of hosts the
    test then tries to connect to or resolve, in order. Off-loopback ones are refused."""
    seen: list[str] = []
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            seen.append(str(address[0]))
            if not is_loopback(str(address[0])):
                raise AssertionError(f"test tried to connect to non-loopback {address!r}")
        return real_connect(self, address)

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
        if host is not None:
            seen.append(str(host))
            if not is_loopback(str(host)):
                raise AssertionError(f"test tried to resolve non-loopback host {host!r}")
        return real_getaddrinfo(host, *args, **kw)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return seen
