"""`nodeprep bootstrap`: one-shot node bring-up as a list of resumable steps.

driver (install + activate from the store) -> modules (load + doctor) -> labels -> runtime
(containerd) -> join. Each step is a function `Context -> dict` (its JSON-able result). Completion
is recorded per step in ROOT/var/lib/nodeprep/bootstrap.json under a digest of the profile: a rerun
after a failure continues at the failed step, a rerun after success runs nothing and writes nothing,
a changed profile (new digest) starts over. The steps (end of this module) are thin adapters over
the install, labels and join libraries.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from .artifact import canonical_json, sha256_bytes
from .errors import InputError, NodeprepError, StateError

log = logging.getLogger(__name__)

STATE_FILE = Path("var/lib/nodeprep/bootstrap.json")
LOCK_FILE = Path("var/lib/nodeprep/bootstrap.lock")
STATE_FORMAT = 1
KEEP_RUNS = 5  # digests kept in the state file (newest first by start time)

Status = Literal["done", "skipped", "failed", "pending"]


@dataclass(frozen=True)
class Options:
    """How bootstrap runs, beyond the profile (front-end flags)."""

    dry_run_join: bool = False
    sysfs_root: Path = Path("/sys")  # where GPU/DMI facts are read (labels)
    nvidia_smi_xml: Path | None = None  # GPU facts from this capture instead of asking the driver
    load_modules: bool | None = None  # None: only when root is / (never modprobe for an image)


@dataclass(frozen=True)
class Context:
    """What a step sees: the target root, the loaded profile and the results of earlier steps."""

    root: Path
    profile: Any  # nodeprep.profile.Profile
    profile_path: Path
    digest: str
    options: Options = field(default_factory=Options)
    results: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def dry_run_join(self) -> bool:
        return self.options.dry_run_join

    @property
    def live(self) -> bool:
        """True when operating on the running system (root is /)."""
        return self.root.resolve() == Path("/")


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    run: Callable[[Context], dict[str, Any]]


@dataclass(frozen=True)
class Outcome:
    name: str
    status: Status
    seconds: float = 0.0
    result: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    exit_code: int = 0  # of the error: 2 for bad input (profile, store path), else 1


@dataclass(frozen=True)
class Report:
    digest: str
    outcomes: tuple[Outcome, ...]
    seconds: float
    state_path: Path

    @property
    def ok(self) -> bool:
        return all(o.status in ("done", "skipped") for o in self.outcomes)

    @property
    def changed(self) -> bool:
        return any(o.status in ("done", "failed") for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        return next((o.exit_code or 1 for o in self.outcomes if o.status == "failed"), 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "changed": self.changed,
            "profile_digest": self.digest,
            "seconds": round(self.seconds, 3),
            "state": str(self.state_path),
            "exit_code": self.exit_code,
            "steps": [{**asdict(o), "seconds": round(o.seconds, 3)} for o in self.outcomes],
        }


def profile_digest(raw: bytes) -> str:
    """Digest of a profile's content: YAML parsed and canonicalised, so comments and layout don't count."""
    from .yamlinput import decode_text, parse_yaml

    try:
        data: Any = parse_yaml(decode_text(raw, source="profile"), source="profile").data
    except InputError:
        data = raw.decode("utf-8", "replace")
    return sha256_bytes(canonical_json(data))


# ---------------------------------------------------------------------------------------------
# State


def load_state(root: Path) -> dict[str, Any]:
    path = root / STATE_FILE
    if not path.exists():
        return {"format": STATE_FORMAT, "runs": {}}
    try:
        data = json.loads(path.read_text())
        if data.get("format") != STATE_FORMAT or not isinstance(data.get("runs"), dict):
            raise ValueError(f"format {data.get('format')!r}")
    except (ValueError, AttributeError) as e:
        raise StateError(f"{path}: unreadable bootstrap state ({e})",
                         hint="remove it (or run with --restart) to start the bootstrap over") from None
    return data


def save_state(root: Path, state: Mapping[str, Any]) -> None:
    path = root / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bootstrap.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    path = root / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateError(f"{path}: another nodeprep bootstrap is running") from None
        yield


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Engine


def run_steps(
    root: Path,
    profile: Any,
    profile_path: Path,
    digest: str,
    steps: Sequence[Step],
    *,
    options: Options | None = None,
    restart: bool = False,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> Report:
    """Run `steps` in order, skipping those recorded as done for `digest`; stop at the first failure."""
    start = time.monotonic()
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate step names: {names}")
    outcomes: list[Outcome] = []
    with _locked(root):
        try:
            state = load_state(root)
        except StateError:
            if not restart:
                raise
            state = {"format": STATE_FORMAT, "runs": {}}
        run = state["runs"].get(digest)
        if run is None or restart:
            run = {"profile": str(profile_path), "started": _now(), "steps": {}}
        recorded: dict[str, dict[str, Any]] = run["steps"]
        results: dict[str, Mapping[str, Any]] = {
            n: r.get("result", {}) for n, r in recorded.items() if r.get("status") == "done"
        }
        failed = False
        for step in steps:
            if failed:
                outcome = Outcome(step.name, "pending")
            elif recorded.get(step.name, {}).get("status") == "done":
                outcome = Outcome(step.name, "skipped", result=results[step.name])
            else:
                ctx = Context(root=root, profile=profile, profile_path=profile_path, digest=digest,
                              options=options or Options(), results=dict(results))
                t0 = time.monotonic()
                try:
                    result = step.run(ctx) or {}
                    json.dumps(result)  # results are recorded: they must be JSON
                except NodeprepError as e:
                    outcome = Outcome(step.name, "failed", time.monotonic() - t0, error=str(e),
                                      exit_code=e.exit_code)
                except Exception as e:
                    outcome = Outcome(step.name, "failed", time.monotonic() - t0,
                                      error=f"{type(e).__name__}: {e}", exit_code=1)
                    _record(root, state, digest, run, outcome)
                    if on_outcome:
                        on_outcome(outcome)
                    raise
                else:
                    outcome = Outcome(step.name, "done", time.monotonic() - t0, result=result)
                    results[step.name] = result
                _record(root, state, digest, run, outcome)
                failed = outcome.status == "failed"
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)
    return Report(digest=digest, outcomes=tuple(outcomes), seconds=time.monotonic() - start,
                  state_path=root / STATE_FILE)


def _record(root: Path, state: dict[str, Any], digest: str, run: dict[str, Any], outcome: Outcome) -> None:
    entry: dict[str, Any] = {"status": outcome.status, "seconds": round(outcome.seconds, 3), "at": _now()}
    if outcome.status == "done":
        entry["result"] = dict(outcome.result)
    if outcome.error:
        entry["error"] = outcome.error
    run["steps"][outcome.name] = entry
    run["completed"] = False
    runs = {digest: run, **{k: v for k, v in state["runs"].items() if k != digest}}
    state["runs"] = dict(list(runs.items())[:KEEP_RUNS])
    save_state(root, state)


def bootstrap(
    profile_path: Path,
    *,
    root: Path = Path("/"),
    options: Options | None = None,
    restart: bool = False,
    steps: Sequence[Step] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> Report:
    """Bring up the node described by `profile_path` (a file on this machine) under `root`."""
    from .profile import parse_profile, read_profile

    _, document = read_profile(profile_path)  # bounded, strict: the reader of every command
    profile = parse_profile(document.data, str(profile_path), document)
    if steps is None:
        steps = default_steps()
    digest = sha256_bytes(canonical_json(document.data))  # == profile_digest(raw) for a valid file
    return run_steps(root, profile, profile_path, digest, steps, options=options,
                     restart=restart, on_outcome=on_outcome)


def describe(outcome: Outcome) -> str:
    """One journal line for a step."""
    if outcome.status == "skipped":
        return f"bootstrap: {outcome.name}: already done"
    if outcome.status == "pending":
        return f"bootstrap: {outcome.name}: not run (an earlier step failed)"
    summary = outcome.result.get("summary") if outcome.result else None
    text = f"bootstrap: {outcome.name}: {outcome.status} in {outcome.seconds:.1f}s"
    if outcome.error:
        text += f": {outcome.error}"
    elif summary:
        text += f" ({summary})"
    return text


def summary_line(report: Report) -> str:
    counts: dict[str, int] = {}
    for o in report.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    verdict = "node ready" if report.ok else "FAILED (rerun to resume)"
    return f"bootstrap: {verdict} in {report.seconds:.1f}s ({parts}); state {report.state_path}"


# ---------------------------------------------------------------------------------------------
# The steps: thin adapters over the install (nodeprep.node), labels (nodeprep.labels) and join
# (nodeprep.join) libraries. Each returns a JSON-able dict with a one-line `summary`.

NFD_FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/nodeprep"
LABELS_JSON = "/etc/nodeprep/labels.json"


def _under(root: Path, target: str) -> Path:
    return root / target.lstrip("/")


def _kernel(ctx: Context) -> str | None:
    """The profile's driver.kernel; on a live system None (the running kernel); with --root the one
    kernel installed in the image (ROOT/lib/modules/<release>)."""
    kernel = ctx.profile.driver.kernel
    if kernel or ctx.live:
        return kernel  # type: ignore[no-any-return]
    found = sorted({p.name for d in ("lib/modules", "usr/lib/modules") if (ctx.root / d).is_dir()
                    for p in (ctx.root / d).iterdir() if p.is_dir()})
    if len(found) != 1:
        raise InputError(f"driver.kernel: required with --root {ctx.root} (kernels in the image: "
                         f"{', '.join(found) or 'none'})")
    return found[0]


def _load(ctx: Context) -> bool:
    return ctx.live if ctx.options.load_modules is None else ctx.options.load_modules


def step_driver(ctx: Context) -> dict[str, Any]:
    """Install user space + kmod of driver.version from driver.store and make it the active root."""
    from .node import install

    drv = ctx.profile.driver
    if not drv.store:
        raise InputError(f"{ctx.profile_path}: driver.store is not set (where the artifacts come from)")
    from .stores.oci import Options as StoreOptions

    def on_node(path: str | None) -> str | None:  # profile paths name files on the node (under --root)
        return str(ctx.root / path.lstrip("/")) if path else None

    options = StoreOptions(registry_auth=on_node(drv.registry_auth), ca_file=on_node(drv.ca_file),
                           insecure_http=drv.insecure_http)
    from .join.activation import HOOKS

    result = install(ctx.root, drv.store, drv.version, kernel=_kernel(ctx), flavour=drv.flavour,
                     activate=True, load=False, modules=tuple(drv.modules), store_options=options,
                     hooks=HOOKS, keep_boot_kernel=drv.keep_boot_kernel)
    data = result.to_dict()
    data["summary"] = (f"{result.version} active for kernel {result.kernel}"
                       + ("" if result.changed else " (already installed)"))
    return data


def step_modules(ctx: Context) -> dict[str, Any]:
    """Load the modules (live systems) and run doctor as the gate for the rest of the bring-up."""
    from .node.devices import load_modules
    from .node.doctor import doctor

    made: list[str] = []
    loaded = _load(ctx)
    if loaded:
        made = load_modules(tuple(ctx.profile.driver.modules), root=ctx.root)
    # Offline (--root): no GPU, module or device nodes to look at; the image's driver root and ld cache are.
    checks = None if ctx.live else {"state", "ldcache", "kmod"}
    report = doctor(ctx.root, checks=checks)
    if not report.ok:
        raise StateError("doctor: " + "; ".join(f"{c.name}: {c.message}" for c in report.problems()),
                         hint="nodeprep doctor shows every check")
    ran = [c.name for c in report.checks if not c.skipped]
    return {"loaded": loaded, "device_nodes": made, "doctor": report.to_dict(),
            "summary": ("modules loaded; " if loaded else "modules not loaded (offline root); ")
            + f"doctor ok ({', '.join(ran)})"}


def step_labels(ctx: Context) -> dict[str, Any]:
    """Compute the node's labels; write them as an NFD feature file and as JSON for the join."""
    from .labels import LabelOptions, node_labels
    from .labels.output import render_nfd
    from .node.fsutil import atomic_write

    opts = LabelOptions(
        root=ctx.root, sysfs_root=ctx.options.sysfs_root, nvidia_smi_xml=ctx.options.nvidia_smi_xml,
        cloud=ctx.profile.labels.cloud, extra=dict(ctx.profile.labels.extra),
        kernel=ctx.results.get("driver", {}).get("kernel") or ctx.profile.driver.kernel,
        use_nvml=ctx.live, run_nvidia_smi=ctx.live,
    )
    result = node_labels(opts)
    for w in result.warnings:
        log.warning("warning: %s", w)
    labels = dict(sorted(result.labels.items()))
    atomic_write(_under(ctx.root, NFD_FEATURES), render_nfd(labels))
    atomic_write(_under(ctx.root, LABELS_JSON), json.dumps(labels, indent=2, sort_keys=True) + "\n")
    return {"labels": labels, "sources": result.sources, "warnings": list(result.warnings),
            "files": [NFD_FEATURES, LABELS_JSON],
            "summary": f"{len(labels)} labels (gpu facts: {result.sources.get('gpu', 'none')})"}


def _join_options(ctx: Context) -> Any:
    from .join import JoinOptions

    labels = ctx.results.get("labels", {}).get("labels")
    # doctor already gated the bring-up in the modules step (with the checks that fit --root)
    return JoinOptions(root=ctx.root, nvidia_smi_xml=ctx.options.nvidia_smi_xml, labels=labels,
                       skip_preflight=True)


def step_runtime(ctx: Context) -> dict[str, Any]:
    """containerd drop-in (nvidia runtime, CDI) and the CDI spec for the active driver root."""
    from .join import apply_runtime, plan_runtime

    plan = plan_runtime(ctx.profile, _join_options(ctx))
    result = apply_runtime(plan)
    result["summary"] = (f"wrote {', '.join(result['written'])}" if result["written"]
                         else "containerd configuration unchanged")
    return result


def step_join(ctx: Context) -> dict[str, Any]:
    """Join the cluster (kubeadm/kubelet); with dry-run, or offline, only write the configuration."""
    from .join import join

    if ctx.profile.cluster is None:
        return {"joined": False, "summary": "no cluster section in the profile: not joining"}
    plan, result = join(ctx.profile, _join_options(ctx), dry_run=ctx.dry_run_join)
    ran = result.get("ran", [])
    deferred = result.get("deferred_commands", [])
    if ran:
        summary = f"joined ({plan.mode}, ran {' ; '.join(' '.join(a) for a in ran)})"
    elif ctx.dry_run_join:
        summary = f"dry run: {plan.mode} configuration written, nothing run"
    elif deferred:
        summary = f"configuration written; at first boot: {' ; '.join(' '.join(a) for a in deferred)}"
    else:
        summary = "configuration written; " + ("already joined" if plan.already_joined else "nothing to run")
    result["dry_run"] = ctx.dry_run_join
    result["summary"] = summary
    return result


def default_steps() -> list[Step]:
    return [
        Step("driver", "Install and activate the NVIDIA driver", step_driver),
        Step("modules", "Load modules, doctor", step_modules),
        Step("labels", "Node labels", step_labels),
        Step("runtime", "Container runtime", step_runtime),
        Step("join", "Join the cluster", step_join),
    ]
