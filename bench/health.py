#!/usr/bin/env python3
"""Benchmark the GPU health service (`nodeprep health --watch --apply`): its CPU and resident memory
at rest, and per event the time from a fault to the condition on the API and the CPU it took.
Goals: at rest <= 1 % of one core and <= 30 MB resident; an event on the API <= 2 s.

The GPUs are NVIDIA's NVML mock (NODEPREP_MOCKNVML, its 8-GPU H100 profile; a fault comes and goes
through the mock's runtime overrides file, as in tests/slow/health); the API is a loopback stub
started here that answers the Node GET and records when each status PATCH arrives (the slow test
shows the same path against kube-apiserver). Nothing leaves the machine. The mock is a Go library
with its own runtime: its threads and heap are in the resident figure, which the real libnvidia-ml
does not have; the figure is printed as measured.

    python3 bench/health.py [--rest SECONDS] [--events N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Goals, cannot_measure, run, use_venv  # noqa: E402  (bench/benchlib.py)

use_venv()

from tests.support import mocknvml  # noqa: E402

FIXTURES = REPO / "tests/fixtures/mocknvml"
NODE = "bench-node"
TICK = os.sysconf("SC_CLK_TCK")


class Api:
    """A loopback stand-in for the API server: GET /api/v1/nodes/NODE, PATCH .../status (recorded)."""

    def __init__(self) -> None:
        self.patches: list[tuple[float, dict[str, Any]]] = []
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's spelling
                self._send({"metadata": {"name": NODE}, "status": {"conditions": []}})

            def do_PATCH(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with api.lock:
                    api.patches.append((time.monotonic(), body["status"]["conditions"][0]))
                self._send({"metadata": {"name": NODE}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait(self, status: str, after: float, timeout: float = 30) -> float:
        """When the first PATCH with `status` arrived after `after` (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for at, cond in self.patches:
                    if at >= after and cond["status"] == status:
                        return at
            time.sleep(0.01)
        raise SystemExit(f"no GPUHealthy={status} on the API within {timeout:.0f}s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


SERVICE = ("import nodeprep.cli, nodeprep.commands.health, nodeprep.health.service, "
           "nodeprep.health.condition, "
           "nodeprep.kubeapi, ssl, http.client")
RSS_PARTS = (
    ("python alone", "pass"),
    ("python + pynvml, NVML initialised (the mock: Go)", "import pynvml; pynvml.nvmlInit()"),
    ("python + click + nodeprep.cli (no command module)", "import nodeprep.cli"),
    ("python + the health command, service, its client", SERVICE),
    ("all of these, NVML initialised", f"import pynvml; pynvml.nvmlInit(); {SERVICE}"),
    ("(requests, the other commands' client, alone)", "import requests"),
)


def part_rss(code: str, env: dict[str, str]) -> float:
    probe = f"{code}\nimport re\nprint(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return int(out.split()[-1]) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rest", type=float, default=30.0, help="seconds measured at rest (default 30)")
    ap.add_argument("--events", type=int, default=3, help="faults brought and taken away (default 3)")
    ap.add_argument("--interval", type=float, default=2.0,
                    help="the service's --interval, seconds between state reads (default 2, its default)")
    args = ap.parse_args()
    if mocknvml.skip_reason():
        cannot_measure(str(mocknvml.skip_reason()))
    cache = Path(os.environ.get("NODEPREP_TEST_CACHE", Path.home() / ".cache" / "nodeprep-tests"))
    api = Api()
    with tempfile.TemporaryDirectory(prefix="nodeprep-bench-health-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "b",
            "clusters": [{"name": "b", "cluster": {"server": api.url}}],
            "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
            "users": [{"name": "b", "user": {"token": "bench"}}]}))
        overrides = Path(tmp) / "overrides.yaml"
        shutil.copyfile(FIXTURES / "healed.yaml", overrides)
        env = mocknvml.env(cache, "h100")
        env["MOCK_NVML_OVERRIDES"] = str(overrides)
        proc = subprocess.Popen([sys.executable, "-m", "nodeprep.cli", "health", "--watch", "--apply",
                                 "--kubeconfig", str(kubeconfig), "--node", NODE, "--hold", "1",
                                 "--xid-window", "2",
                                 "--interval", f"{args.interval:g}",
                                 "--no-kmsg"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=(Path(tmp) / "health.log").open("wb"))
        try:
            api.wait("True", 0.0)
            time.sleep(2.0)  # settled after the first write
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(args.rest)
            rest_cpu = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0) * 100
            rest_rss = rss_mb(proc.pid)
            latencies, cpus = [], []
            for _ in range(args.events):
                c1, t1 = cpu_seconds(proc.pid), time.monotonic()
                shutil.copyfile(FIXTURES / "fallen-off-bus.yaml", overrides)
                latencies.append(api.wait("False", t1) - t1)
                cpus.append((cpu_seconds(proc.pid) - c1) * 1000)
                t2 = time.monotonic()
                shutil.copyfile(FIXTURES / "healed.yaml", overrides)
                api.wait("True", t2)
                time.sleep(1.0)
            peak = rss_mb(proc.pid)
        except SystemExit:
            print((Path(tmp) / "health.log").read_text()[-2000:], file=sys.stderr)
            raise
        finally:
            proc.terminate()
            proc.wait(10)
    goals = Goals()
    print(f"at rest ({args.rest:.0f} s, 8 GPUs, state read every {args.interval:g} s, event set waited 1 s "
          "at a time):")
    print(f"  CPU                   {rest_cpu:6.2f} % of one core (goal <= 1 %)  "
          f"{goals.at_most('CPU at rest <= 1 %', rest_cpu, 1.0)}")
    print(f"  resident memory       {rest_rss:6.1f} MB (goal <= 30 MB)  "
          f"{goals.at_most('RSS at rest <= 30 MB', rest_rss, 30.0)}")
    print(f"per event ({args.events} faults: GPU 0 off the bus with Xid 79, then healed):")
    print(f"  fault to the API      {max(latencies):6.2f} s worst, {min(latencies):.2f} s best "
          "(goal <= 2 s)  "
          f"{goals.at_most('event on the API <= 2 s', max(latencies), 2.0)}")
    print(f"  CPU per event         {max(cpus):6.0f} ms worst, {min(cpus):.0f} ms best (for information)")
    print(f"  resident after events {peak:6.1f} MB (for information)")
    print("where the resident memory goes (a fresh interpreter each, for information):")
    parts = {what: part_rss(code, env) for what, code in RSS_PARTS}
    for what, mb in parts.items():
        print(f"  {what:<50} {mb:6.1f} MB")
    mock = parts[RSS_PARTS[1][0]] - parts[RSS_PARTS[0][0]]
    print(f"ours at rest (the service less the mock's {mock:.1f} MB of NVML): {rest_rss - mock:6.1f} MB "
          "(a real libnvidia-ml's share is not measured here: no GPU)")
    return goals.exit_code()


if __name__ == "__main__":
    run(main)
