"""A TCP relay for tests: the loopback-only kube-apiserver of tests/support/controlplane.py reached from a
test host's network namespace at the same address (127.0.0.1:PORT inside the namespace), so the node's
own kubeconfig names the server its certificate was issued for.

Two relays per host: in the host's namespace 127.0.0.1:PORT -> GATEWAY:PORT (the root-namespace end of
its veth), and in the root namespace GATEWAY:PORT -> 127.0.0.1:PORT. `apiserver_in(host, port)` runs
both and stops them again. Run as `python -m tests.support.relay LISTEN_HOST PORT TARGET_HOST PORT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _serve(listen: str, port: int, target: str, target_port: int) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            tr, tw = await asyncio.open_connection(target, target_port)
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, tw), _pipe(tr, w))

    server = await asyncio.start_server(handle, listen, port, reuse_address=True)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


def _start(argv: list[str]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.stdout is not None
    if p.stdout.readline().strip() != b"listening":
        p.kill()
        raise RuntimeError(f"relay {argv[-4:]} did not start")
    return p


@contextlib.contextmanager
def apiserver_in(netns: str, gateway: str, port: int) -> Iterator[None]:
    """127.0.0.1:`port` inside `netns` relayed to 127.0.0.1:`port` here, for the duration."""
    me = [sys.executable, "-m", "tests.support.relay"]
    procs = [_start([*me, gateway, str(port), "127.0.0.1", str(port)])]
    try:
        procs.append(_start(["ip", "netns", "exec", netns, *me, "127.0.0.1", str(port), gateway, str(port)]))
        yield
    finally:
        for p in procs:
            p.kill()
        deadline = time.monotonic() + 10
        for p in procs:
            p.wait(max(0.1, deadline - time.monotonic()))


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(_serve(a[0], int(a[1]), a[2], int(a[3])))
