#!/usr/bin/env python3
"""Benchmark: N nodes fetching one driver (kmod + user space) at once from a store on loopback.

    python3 bench/store.py [--cache DIR] [--nodes 1,8,32] [--work DIR]

Stores, all serving the shared real build (tests/support/realbuild.py: the real proprietary
kmod, ~44 MiB, and its user space, ~77 MiB) on 127.0.0.1 (--stores, default all four):
  http      Debian's nginx, run by this script with its own config (tests/support/nginx.py:
            sendfile, no access log)
  socket    a reference, not a store, outside the goal: the same nginx read by a bare-socket
            reader (one GET per file on a plain socket, blocking reads into one 1 MiB buffer, sha256,
            write; no HTTP library, no retries, no resume). What loopback TCP itself leaves of the
            limit on this machine: the ceiling for any HTTP client here
  registry  Debian's docker-registry (CNCF distribution) with TLS (a test CA) and htpasswd auth,
            the artifacts pushed with nodeprep's own publisher
  redirect  the same registry with the storage middleware `redirect`: a blob GET answers 307 to an
            nginx serving the registry's storage directory (the registry keeps auth and manifests,
            nginx sends the bytes; how registries that serve fleets are set up, docs/fleet.md)
Per N, each node is a process running the node's real fetch path, `Store.entries()` then
`Store.fetch()` of both artifacts (download, sha256 against the index; for the registry also the
manifest digests), into its own temporary root. Beside it, the machine's own limit in the same
run: N processes copying the same files from page cache into their roots and verifying their sha256
the same way (no server, no network stack), measured right before and right after each store's
wave and averaged (the machine may be shared with other work).

The node processes are forked from this one with requests (which nodeprep imports on first
network use) already loaded, as the copying processes have everything loaded: a wave measures
fetching, not module loading (about 0.05 s per node process, 0.25 CPU s per GiB at 121 MiB).
Printed per store and N (medians of --rounds interleaved rounds): aggregate MiB/s, the limit, their
ratio, per-node p50/p99 fetch time over all rounds, failures, and where the CPU went: seconds per
GiB delivered of the nodes, of each server process (with its workers, from /proc; registry+nginx
for the redirect row) and of the limit's copy; on a second line the whole machine's CPU per GiB in
the store's wave and in the limit's (/proc/stat: busy, of which kernel, and iowait); on a third the
ratio the servers' own CPU allows at most while they share the nodes' cores (limit busy / (limit
busy + server CPU): what a client no dearer than the limit's copy would reach); the load average
before and after. Goal: at the
largest N (32 by default), aggregate >= 70 % of the limit and no failure, for every store; the last
line names the stores that met it and those that missed it (exit 1 when one missed).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import multiprocessing
import os
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, run, use_venv  # noqa: E402  (bench/benchlib.py, next to this file)

use_venv()

import requests  # noqa: E402,F401  loaded before the nodes fork: they measure fetching, not importing

from nodeprep import artifact  # noqa: E402
from nodeprep.stores import oci  # noqa: E402
from nodeprep.stores.store import Store  # noqa: E402

GOAL = 0.70
CHUNK = 1 << 20

Result = tuple[float, int, str, float]  # one node's (seconds, bytes, error, CPU s)
NodeFn = Callable[[Any], Result]  # what one node process runs
Make = Callable[[Any], Any]  # a node's arguments, given the wave's barrier


def cpu_self() -> float:
    """CPU seconds (user + system) this process has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` and its descendants still running (nginx's
    workers) from /proc; 0 for a process that is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += cpu_of(int(child))
    except (OSError, IndexError, ValueError):
        pass
    return total


def _node(args: tuple[str, Any, str, str, str, Any]) -> Result:
    """One node: the real fetch path into its own root. Returns (seconds, bytes, error, CPU s)."""
    location, options, version, kernel, work, barrier = args
    root = Path(tempfile.mkdtemp(prefix="node-", dir=work))
    try:
        barrier.wait()
        t, c = time.monotonic(), cpu_self()
        store = Store(location, options)
        entries = store.entries()
        us = artifact.find(entries, "userspace", version)
        km = artifact.find(entries, "kmod", version, kernel_release=kernel)
        assert us is not None and km is not None
        got = 0
        for e in (us, km):
            got += store.fetch(e, root / "var/cache/nodeprep").stat().st_size
        return time.monotonic() - t, got, "", cpu_self() - c
    except Exception as e:  # a failure is a result here, counted and printed
        return 0.0, 0, f"{type(e).__name__}: {e}", 0.0
    finally:
        shutil.rmtree(root, ignore_errors=True)


Writer = Callable[[Path, Any], str]  # fills a file and a sha256 object; "" or what went wrong


def _into_root(prefix: str, work: str, barrier: Any, jobs: list[tuple[str, str, Writer]]) -> Result:
    """One node's files into its own root after the wave's barrier, each written by its writer
    and checked against its sha256: (seconds, bytes, error, CPU s)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=work))
    try:
        barrier.wait()
        t, c = time.monotonic(), cpu_self()
        got = 0
        for name, digest, write in jobs:
            dest = root / name
            h = hashlib.sha256()
            error = write(dest, h)
            if error:
                return 0.0, 0, error, 0.0
            if h.hexdigest() != digest:
                return 0.0, 0, f"{dest}: sha256 mismatch", 0.0
            got += dest.stat().st_size
        return time.monotonic() - t, got, "", cpu_self() - c
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _copy_file(src: str, dest: Path, h: Any) -> str:
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        for chunk in iter(lambda: fi.read(1 << 18), b""):
            h.update(chunk)
            fo.write(chunk)
    return ""


def _copy_node(args: tuple[list[str], list[str], str, Any]) -> Result:
    """The limit: copy the same files from page cache into an own root, hashing them on the way
    (sha256, as the fetch path does while it downloads)."""
    files, digests, work, barrier = args
    return _into_root("copy-", work, barrier, [
        (Path(src).name, digest, functools.partial(_copy_file, src))
        for src, digest in zip(files, digests, strict=True)])


def _get_over_socket(port: int, path: str, size: int, buf: memoryview, dest: Path, h: Any) -> str:
    """GET /path from 127.0.0.1:port on a plain socket, the body read into `buf` and written."""
    with socket.create_connection(("127.0.0.1", port)) as sock, open(dest, "wb") as fo:
        sock.sendall(f"GET /{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            more = sock.recv(65536)
            if not more:
                return f"{path}: connection closed in the headers"
            head += more
        head, body = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 200"):
            return f"{path}: {head.splitlines()[0].decode()}"
        h.update(body)
        fo.write(body)
        left = size - len(body)
        while left > 0:
            n = sock.recv_into(buf[:min(len(buf), left)])
            if not n:
                return f"{path}: connection closed with {left} bytes to come"
            h.update(buf[:n])
            fo.write(buf[:n])
            left -= n
    return ""


def _socket_node(args: tuple[int, list[str], list[str], list[int], str, Any]) -> Result:
    """The reference: the same files from nginx through a bare socket into an own root (blocking
    reads into one buffer, sha256, write), to set nodeprep's HTTP path beside loopback TCP itself."""
    port, paths, digests, sizes, work, barrier = args
    buf = memoryview(bytearray(CHUNK))
    return _into_root("socket-", work, barrier, [
        (path, digest, functools.partial(_get_over_socket, port, path, size, buf))
        for path, digest, size in zip(paths, digests, sizes, strict=True)])


def machine_cpu() -> tuple[float, float, float]:
    """(busy, kernel, iowait) seconds of the whole machine so far, from /proc/stat: busy is user,
    nice, system, irq, softirq and steal; kernel is system + irq + softirq."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return ((user + nice + system + irq + softirq + steal) / tick, (system + irq + softirq) / tick,
            iowait / tick)


def run_wave(n: int, fn: NodeFn, make: Make,
             server: tuple[int, ...] | list[int] = ()) -> dict[str, Any]:
    # each wave writes N x 121 MiB; the previous wave's writeback is finished before this one starts
    # (unmeasured), so it does not compete with whichever wave comes next
    os.sync()
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as mgr:
        barrier = mgr.Barrier(n)
        with ctx.Pool(n) as pool:
            t = time.monotonic()
            s0 = [cpu_of(p) for p in server]
            m0 = machine_cpu()
            results = pool.map(fn, [make(barrier) for _ in range(n)])
            machine = [b - a for a, b in zip(m0, machine_cpu(), strict=True)]
            server_cpu = [cpu_of(p) - c for p, c in zip(server, s0, strict=True)]
            wall = time.monotonic() - t
    times = sorted(r[0] for r in results if not r[2])
    total = sum(r[1] for r in results)
    errors = [r[2] for r in results if r[2]]
    # aggregate over the span the fetches ran (the slowest node), not the pool's start-up
    span = max(times) if times else wall
    gib = total / 2**30 or 1.0
    return {"n": n, "mib_s": total / span / 2**20 if span else 0.0, "bytes": total, "times": times,
            "failures": len(errors), "errors": errors[:3],
            "node_cpu": sum(r[3] for r in results) / gib, "server_cpu": [c / gib for c in server_cpu],
            "machine": [x / gib for x in machine]}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("NODEPREP_TEST_CACHE", "/var/cache/nodeprep-tests")))
    ap.add_argument("--nodes", default="1,8,32")
    ap.add_argument("--work", type=Path, default=None, help="Temporary roots (default: a temp dir).")
    ap.add_argument("--stores", default="http,socket,registry,redirect",
                    help="Some of http, socket (the reference reader), registry, redirect.")
    ap.add_argument("--rounds", type=int, default=3,
                    help="Interleaved rounds per store and N (limit, store, limit); medians are printed.")
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    stores = args.stores.split(",")
    if not stores or set(stores) - {"http", "socket", "registry", "redirect"}:
        sys.exit(f"--stores: {args.stores!r}: give some of http, socket, registry, redirect")

    from tests.support.nginx import start_nginx
    from tests.support.realbuild import ensure_real_build
    from tests.support.registry import start_redirecting_registry, start_registry, write_auth_file

    build = ensure_real_build(args.cache)
    store_dir = build.store
    entries = artifact.LocalStore(store_dir).entries()
    us = artifact.find(entries, "userspace", build.driver_version)
    km = artifact.find(entries, "kmod", build.driver_version, kernel_release=build.kernel_release)
    if us is None or km is None:
        sys.exit(f"{store_dir}: the real build lacks the user space or the kmod")
    files = [str(store_dir / us.name), str(store_dir / km.name)]
    digests = [us.sha256, km.sha256]
    per_node = us.size + km.size
    for f in files:  # into page cache
        with open(f, "rb") as fh:
            while fh.read(CHUNK):
                pass

    work = Path(tempfile.mkdtemp(prefix="nodeprep-bench-store-", dir=args.work))
    servers: list[Any] = []  # every started server (nginx, registries), stopped at the end
    try:
        # name -> (what one node runs, its arguments, the server pids, whether it counts for the goal)
        locations: dict[str, tuple[NodeFn, Make, list[int], bool]] = {}

        def fetching(location: str, options: Any) -> Make:
            return lambda b: (location, options, build.driver_version, build.kernel_release, str(roots), b)

        def publish(registry: Any, key: str) -> tuple[str, Any]:
            auth = write_auth_file(work / f"auth-{key}.json", registry.host)
            options = oci.Options(registry_auth=str(auth), ca_file=str(registry.ca))
            location = registry.url("bench/nvidia")
            oci.publish_directory(oci.connect(location, options, push=True), store_dir)
            return location, options

        roots = work / "roots"
        roots.mkdir()
        if "http" in stores or "socket" in stores:
            web = start_nginx(work / "nginx", store_dir)
            servers.append(web)
            assert web.proc is not None
        if "http" in stores:
            locations["http (nginx)"] = (_node, fetching(web.url, oci.Options()), [web.proc.pid], True)
        if "socket" in stores:
            locations["reference: nginx to a bare-socket reader"] = (
                _socket_node, lambda b, port=web.port: (port, [us.name, km.name], digests, [us.size, km.size],
                                                        str(roots), b),
                [web.proc.pid], False)
        if "registry" in stores:
            registry = start_registry(work / "registry")
            servers.append(registry)
            location, options = publish(registry, "registry")
            assert registry.proc is not None
            locations["registry (TLS+auth)"] = (_node, fetching(location, options), [registry.proc.pid], True)
        if "redirect" in stores:
            registry, web = start_redirecting_registry(work / "redirect", access_log=False)
            servers += [registry, web]
            location, options = publish(registry, "redirect")
            assert registry.proc is not None and web.proc is not None
            locations["registry (TLS+auth, blobs redirected to nginx)"] = (
                _node, fetching(location, options), [registry.proc.pid, web.proc.pid], True)
        print(f"per node: {per_node / 2**20:.1f} MiB ({us.name}, {km.name}); cores: {os.cpu_count()}")
        print(f"load average before: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} "
              f"{os.getloadavg()[2]:.1f}")
        width = max(len(name) for name in locations) + 2
        print(f"{'store':<{width}}{'N':>4}{'MiB/s':>10}{'limit MiB/s':>13}{'ratio':>8}{'p50 s':>8}"
              f"{'p99 s':>8}{'fail':>6}{'CPU s/GiB node/server/limit':>30}")
        met: list[str] = []
        missed: list[str] = []
        limit_cpu: list[float] = []
        limit_machine: list[list[float]] = []

        def limit_now(n: int) -> float:
            res = run_wave(n, _copy_node, lambda b: (files, digests, str(roots), b))
            limit_cpu.append(res["node_cpu"])
            limit_machine.append(res["machine"])
            return float(res["mib_s"])

        for n in counts:
            for name, (node, make, pids, counts_for_goal) in locations.items():
                rates, limits, ratios, times, failures, errors = [], [], [], [], 0, []
                node_cpu, server_cpu, machine = [], [], []
                limit_cpu.clear()
                limit_machine.clear()
                for _ in range(args.rounds):
                    # the limit right before and right after the store's wave (the machine is shared)
                    before = limit_now(n)
                    res = run_wave(n, node, make, pids)
                    node_cpu.append(res["node_cpu"])
                    server_cpu.append(res["server_cpu"])
                    machine.append(res["machine"])
                    limit = (before + limit_now(n)) / 2
                    rates.append(res["mib_s"])
                    limits.append(limit)
                    ratios.append(res["mib_s"] / limit if limit else 0.0)
                    times += res["times"]
                    failures += res["failures"]
                    errors += res["errors"]
                ratio = statistics.median(ratios)
                per_server = "+".join(f"{statistics.median(c):.2f}" for c in zip(*server_cpu, strict=True))
                print(f"{name:<{width}}{n:>4}{statistics.median(rates):>10.0f}{statistics.median(limits):>13.0f}"
                      f"{ratio:>8.0%}{percentile(times, 0.5):>8.2f}{percentile(times, 0.99):>8.2f}"
                      f"{failures:>6}{statistics.median(node_cpu):>12.2f}/{per_server}/"
                      f"{statistics.median(limit_cpu):.2f}   (ratios "
                      f"{', '.join(f'{r:.0%}' for r in ratios)})", flush=True)
                busy, kernel, iowait = (statistics.median(c) for c in zip(*machine, strict=True))
                l_busy, l_kernel, l_iowait = (statistics.median(c) for c in zip(*limit_machine, strict=True))
                print(f"{'':<{width}}    machine CPU s/GiB, store vs limit: busy {busy:.2f} vs {l_busy:.2f} "
                      f"(kernel {kernel:.2f} vs {l_kernel:.2f}), iowait {iowait:.2f} vs {l_iowait:.2f}")
                # the servers share the nodes' cores here: with a client no dearer than the limit's
                # copy, the servers' own CPU per GiB would still hold the ratio at or below this
                served = sum(statistics.median(c) for c in zip(*server_cpu, strict=True))
                print(f"{'':<{width}}    servers' own CPU on the same cores caps this row at "
                      f"{l_busy / (l_busy + served):.0%} (limit busy / (limit busy + server CPU))")
                for err in errors[:3]:
                    print(f"    failure: {err}")
                if n == max(counts) and counts_for_goal:
                    verdict = f"{name}: {ratio:.0%} of the limit at N={n}, {failures} failures"
                    (missed if ratio < GOAL or failures else met).append(verdict)
        print(f"load average after: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} "
              f"{os.getloadavg()[2]:.1f}")
        goals = Goals()
        goals.check(f"every store >= {GOAL:.0%} of the limit at N={max(counts)}, no failures", not missed)
        print(f"goal (>= {GOAL:.0%} of the page-cache limit at N={max(counts)}, no failures) met by: "
              f"{'; '.join(met) or 'none'}")
        print(f"goal missed by: {'; '.join(missed) or 'none'}")
        return goals.exit_code()
    finally:
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run(main)
