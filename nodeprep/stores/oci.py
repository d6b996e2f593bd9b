"""An OCI registry repository as an artifact store (`oci://HOST[:PORT]/REPO[@sha256:...]`).

Layout (docs/build.md, "OCI registry stores"):
- each artifact is an OCI artifact: an image manifest with `artifactType`
  application/vnd.nodeprep.<kind>.v1, the empty config, one layer (the .tar.zst, media type
  application/vnd.nodeprep.<kind>.v1.tar+zstd) and annotations naming driver, flavour, kernel,
  OS, arch and input digest; tagged with the artifact's file name (`ref.tag_for`);
- the store index is an artifact too (artifactType application/vnd.nodeprep.index.v1, tag
  `index`): layer 1 is the very `index.json` a directory store has, layer 2 maps each artifact
  name to the digest of its manifest. A node reads artifacts through those digests, so pinning
  the index (`oci://host/repo@sha256:<index manifest digest>`) pins every byte it installs.

Manifests are canonical JSON without timestamps: publishing the same artifact twice gives the
same digest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact import INDEX, IndexEntry, parse_index, read_index, render_index, sha256_listed
from ..digests import canonical_json
from ..download import NotFoundError
from ..errors import ArtifactError, ChecksumError, InputError
from ..profile.fields import field_error
from . import auth
from .ref import OciRef, parse_ref, tag_for
from .registry import MT_OCI_MANIFEST, Registry, sha256_digest

log = logging.getLogger(__name__)

MT_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
ARTIFACT_TYPES = {
    "kmod": "application/vnd.nodeprep.kmod.v1",
    "userspace": "application/vnd.nodeprep.userspace.v1",
    "index": "application/vnd.nodeprep.index.v1",
}
LAYER_TYPES = {
    "kmod": "application/vnd.nodeprep.kmod.v1.tar+zstd",
    "userspace": "application/vnd.nodeprep.userspace.v1.tar+zstd",
}
MT_INDEX = "application/vnd.nodeprep.index.v1+json"
MT_REFS = "application/vnd.nodeprep.refs.v1+json"
INDEX_TAG = "index"
ANNOTATION = "dev.nodeprep."
TITLE = "org.opencontainers.image.title"


@dataclass(frozen=True)
class Options:
    """How to reach a registry: credentials file, CA bundle, plain http off loopback."""

    registry_auth: str | None = None
    ca_file: str | None = None
    insecure_http: bool = False


def _descriptor(media_type: str, data_digest: str, size: int, annotations: dict[str, str] | None = None
                ) -> dict[str, Any]:
    d: dict[str, Any] = {"mediaType": media_type, "digest": data_digest, "size": size}
    if annotations:
        d["annotations"] = annotations
    return d


def _empty_config() -> dict[str, Any]:
    return _descriptor(MT_EMPTY, sha256_digest(EMPTY), len(EMPTY))


def manifest_annotations(entry: IndexEntry) -> dict[str, str]:
    """The manifest annotations of an artifact: what it is, without opening it."""
    values = {"kind": entry.kind, "driver": entry.driver_version, "os": entry.os, "arch": entry.arch,
              "input-digest": entry.input_digest, "name": entry.name,
              "flavour": entry.flavour, "kernel": entry.kernel_release, "vermagic": entry.vermagic}
    return {ANNOTATION + k: v for k, v in values.items() if v}


def artifact_manifest(entry: IndexEntry) -> bytes:
    """The OCI image manifest (canonical JSON) for the artifact `entry`."""
    layer = _descriptor(LAYER_TYPES[entry.kind], "sha256:" + entry.sha256, entry.size, {TITLE: entry.name})
    return canonical_json({
        "schemaVersion": 2,
        "mediaType": MT_OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPES[entry.kind],
        "config": _empty_config(),
        "layers": [layer],
        "annotations": manifest_annotations(entry),
    })


def index_manifest(index: bytes, refs: bytes) -> bytes:
    return canonical_json({
        "schemaVersion": 2,
        "mediaType": MT_OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPES["index"],
        "config": _empty_config(),
        "layers": [_descriptor(MT_INDEX, sha256_digest(index), len(index), {TITLE: INDEX}),
                   _descriptor(MT_REFS, sha256_digest(refs), len(refs), {TITLE: "refs.json"})],
        "annotations": {ANNOTATION + "format": "1"},
    })


def _load_manifest(raw: bytes, source: str, artifact_type: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(raw)
        layers = data["layers"]
        if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
            raise TypeError("layers is not a list of descriptors")
    except (ValueError, TypeError, KeyError) as e:
        raise ArtifactError(f"{source}: malformed OCI manifest ({e})") from None
    if data.get("mediaType") != MT_OCI_MANIFEST or data.get("artifactType") != artifact_type:
        raise ArtifactError(f"{source}: not a nodeprep artifact (artifactType "
                            f"{data.get('artifactType')!r}, expected {artifact_type!r})")
    return layers


def index_layers(raw: bytes, source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (index.json, refs) layer descriptors of an index artifact's manifest."""
    layers = _load_manifest(raw, source, ARTIFACT_TYPES["index"])
    by_type = {x.get("mediaType"): x for x in layers}
    if MT_INDEX not in by_type or MT_REFS not in by_type:
        raise ArtifactError(f"{source}: index artifact lacks its {MT_INDEX} or {MT_REFS} layer")
    return by_type[MT_INDEX], by_type[MT_REFS]


def artifact_layer(raw: bytes, entry: IndexEntry, source: str) -> dict[str, Any]:
    """The layer of an artifact manifest, checked against the store index's entry."""
    layers = _load_manifest(raw, source, ARTIFACT_TYPES[entry.kind])
    if len(layers) != 1 or layers[0].get("mediaType") != LAYER_TYPES[entry.kind]:
        raise ArtifactError(f"{source}: expected one {LAYER_TYPES[entry.kind]} layer")
    layer = layers[0]
    if layer.get("digest") != "sha256:" + entry.sha256 or layer.get("size") != entry.size:
        raise ChecksumError(f"{source}: layer {layer.get('digest')} ({layer.get('size')} bytes) does not "
                            f"match the store index (sha256:{entry.sha256}, {entry.size} bytes)")
    return layer


def _size(desc: dict[str, Any], source: str) -> int:
    size = desc.get("size")
    if not isinstance(size, int) or size < 0:
        raise ArtifactError(f"{source}: descriptor without a valid size")
    return size


def connect(location: str, options: Options | None = None, *, push: bool = False) -> Registry:
    """A registry client for `location`, credentials and CA from `options`/the environment."""
    options = options or Options()
    ref = parse_ref(location, insecure_http=options.insecure_http)
    path = auth.resolve_path(options.registry_auth)
    creds = auth.load(path, ref.host) if path else None
    if options.ca_file and not Path(options.ca_file).is_file():
        raise field_error("driver.ca_file", f"{options.ca_file} does not exist")
    return Registry(ref, credentials=creds, ca_file=options.ca_file, push=push,
                    insecure_http=options.insecure_http)


class OciStore:
    """Node side: the store index and verified artifacts of a registry repository."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.ref: OciRef = registry.ref
        self._refs: dict[str, str] | None = None

    def entries(self) -> list[IndexEntry]:
        reg = self.registry
        source = self.ref.name_of(self.ref.digest or INDEX_TAG)
        try:
            raw, digest = reg.manifest(self.ref.digest or INDEX_TAG)
        except NotFoundError:
            if self.ref.digest:
                raise NotFoundError(f"{source}: the pinned index digest is not in the repository (the pin "
                                    f"does not match what was published)") from None
            raise NotFoundError(f"{source}: no '{INDEX_TAG}' tag in the repository (nothing published "
                                f"there yet, or a wrong repository)") from None
        try:
            index_desc, refs_desc = index_layers(raw, source)
        except ArtifactError as e:
            if self.ref.digest:  # the pin names something else than an index: a wrong pin
                raise InputError(f"{e}; the pinned digest must be the index artifact's") from None
            raise
        index = reg.blob_bytes(str(index_desc.get("digest")), _size(index_desc, source))
        refs_raw = reg.blob_bytes(str(refs_desc.get("digest")), _size(refs_desc, source))
        try:
            refs = json.loads(refs_raw)
            if not isinstance(refs, dict) or not all(isinstance(v, str) for v in refs.values()):
                raise TypeError("not a map of names to digests")
        except (ValueError, TypeError) as e:
            raise ArtifactError(f"{source}: malformed refs layer ({e})") from None
        self._refs = refs
        log.info("%s: index %s", source, digest)
        return parse_index(index, source=f"{source} ({INDEX})")

    def fetch(self, entry: IndexEntry, dest: Path) -> Path:
        """A local copy of `entry` at `dest`: its manifest read by the digest the index recorded, its
        layer checked against the index's sha256 and size, the blob downloaded and verified."""
        if self._refs is None:
            self.entries()
        assert self._refs is not None
        digest = self._refs.get(entry.name)
        if digest is None:
            raise ArtifactError(f"{self.ref}: {entry.name} is in the index but has no manifest reference")
        raw, _ = self.registry.manifest(digest)
        artifact_layer(raw, entry, f"{self.ref}@{digest} ({entry.name})")
        return self.registry.download_blob("sha256:" + entry.sha256, dest, size=entry.size)


def read_remote_index(reg: Registry) -> tuple[list[IndexEntry], dict[str, str]]:
    """The entries and refs under the `index` tag, or empty when nothing was published yet."""
    if not reg.has_manifest(INDEX_TAG):
        return [], {}
    store = OciStore(reg)
    entries = store.entries()
    return entries, dict(store._refs or {})


def publish(reg: Registry, items: Iterable[tuple[IndexEntry, Path]]) -> str:
    """Push artifacts (blob, manifest, tag) and then a new index merging them into the one the
    repository has; returns the new index manifest's digest. Each file is checked against its
    entry's sha256 first. Concurrent publishers to one repository: the last index wins (the
    distribution API has no conditional PUT); serialise them (build-matrix pushes once)."""
    items = list(items)
    for entry, path in items:
        actual = sha256_listed(path.parent, path.name)
        if actual is None:
            raise InputError(f"{path}: listed in {INDEX} but missing")
        if actual != entry.sha256:
            raise ChecksumError(f"{path}: sha256 {actual} does not match the store index {entry.sha256}")
    reg.push_blob(sha256_digest(EMPTY), len(EMPTY), data=EMPTY)
    pushed: dict[str, str] = {}
    for entry, path in items:
        reg.push_blob("sha256:" + entry.sha256, entry.size, path=path)
        pushed[entry.name] = reg.push_manifest(tag_for(entry.name), artifact_manifest(entry))
        log.info("pushed %s as %s:%s", entry.name, reg.ref, tag_for(entry.name))
    entries, refs = read_remote_index(reg)
    names = {e.name for e, _ in items}
    merged = [e for e in entries if e.name not in names] + [e for e, _ in items]
    refs = {**{k: v for k, v in refs.items() if k not in names}, **pushed}
    index = render_index(merged)
    refs_raw = canonical_json(dict(sorted(refs.items())))
    for blob in (index, refs_raw):
        reg.push_blob(sha256_digest(blob), len(blob), data=blob)
    return reg.push_manifest(INDEX_TAG, index_manifest(index, refs_raw))


def publish_directory(reg: Registry, store: Path, names: Iterable[str] | None = None) -> tuple[str, int]:
    """Publish (all or the named) artifacts of a directory store; returns (index digest, count)."""
    entries = read_index(store)
    if entries is None:
        raise InputError(f"{store}: {INDEX} not found (not an artifact store)")
    wanted = set(names) if names is not None else None
    items = [(e, store / e.name) for e in entries if wanted is None or e.name in wanted]
    return publish(reg, items), len(items)

