"""The CSI Identity and Node services over :class:`csi.volumes.Volumes`.

Requests are checked here and domain errors become gRPC status codes here, nowhere else:
a bad or missing field or volume attribute is INVALID_ARGUMENT with a message naming it,
an unknown dataset, version or tag NOT_FOUND, an occupied target (another volume id's
included) ALREADY_EXISTS, a target holding another file system's mount FAILED_PRECONDITION
on unpublish, as are a target that is a non-empty directory and a hub that refuses the
plugin's TLS when a volume's token must be checked (one line naming the flag), a spoke or
hub that cannot answer yet UNAVAILABLE (the kubelet retries), anything else INTERNAL.

A volume's attributes (``volumeAttributes`` of a CSI ephemeral inline volume, or a
PersistentVolume's ``csi.volumeAttributes``) are ``dataset`` and ``ref``; the kubelet adds
its own ``csi.storage.k8s.io/*`` keys (pod name, namespace, uid, ``ephemeral``), which are
allowed and ignored. Any other key is refused, so that a typo never publishes ``latest``
of the wrong thing. The volume is read-only: a request with ``readonly`` false is refused,
so the pod spec says ``readOnly: true`` where a reader sees it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import wrappers_pb2
from prometheus_client import Counter

from csi.hubscope import HubRefused, HubScope, HubUnreachable
from csi.tenancy import Tenancy
from csi.volumes import (
    MAX_NODE_VOLUMES,
    Denied,
    ForeignMount,
    InvalidVolume,
    Misconfigured,
    NoSuchSnapshot,
    SpokeUnavailable,
    TargetNotEmpty,
    TargetTaken,
    TooManyVolumes,
    VolumeError,
    Volumes,
)
from protocol.csi.v1 import csi_pb2, csi_pb2_grpc
from strata_local.audit import AuditLog

log = logging.getLogger(__name__)

DRIVER_NAME = "csi.strata.io"
"""The plugin's name: the CSIDriver object's, and a pod's ``csi.driver``."""

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
"""Dataset, version and tag names (hub/snapshot/names.py): path-safe, never ``.`` or ``..``."""

KUBELET_PREFIX = "csi.storage.k8s.io/"
ATTRIBUTES = ("dataset", "ref")

_CODES: tuple[tuple[type[VolumeError], grpc.StatusCode], ...] = (
    (InvalidVolume, grpc.StatusCode.INVALID_ARGUMENT),
    (Denied, grpc.StatusCode.PERMISSION_DENIED),
    (NoSuchSnapshot, grpc.StatusCode.NOT_FOUND),
    (TargetTaken, grpc.StatusCode.ALREADY_EXISTS),
    (ForeignMount, grpc.StatusCode.FAILED_PRECONDITION),
    (TargetNotEmpty, grpc.StatusCode.FAILED_PRECONDITION),
    (Misconfigured, grpc.StatusCode.FAILED_PRECONDITION),
    (SpokeUnavailable, grpc.StatusCode.UNAVAILABLE),
    (TooManyVolumes, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (VolumeError, grpc.StatusCode.INTERNAL),
)

PUBLISHES = Counter(
    "strata_csi_publishes",
    "NodePublishVolume calls by outcome: ok, denied (tenancy), failed (anything else).",
    ["outcome"],
)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def _abort(context: grpc.ServicerContext, err: VolumeError) -> NoReturn:
    code = next(code for kind, code in _CODES if isinstance(err, kind))
    context.abort(code, str(err))
    raise AssertionError("unreachable: abort raises")


def _mapped(
    method: Callable[[Any, Req, grpc.ServicerContext], Resp],
) -> Callable[[Any, Req, grpc.ServicerContext], Resp]:
    """Run ``method`` with :class:`VolumeError` turned into its status code."""

    def wrapper(self: Any, request: Req, context: grpc.ServicerContext) -> Resp:
        try:
            return method(self, request, context)
        except VolumeError as err:
            log.warning("%s: %s", method.__name__, err)
            _abort(context, err)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def plugin_version() -> str:
    """Strata's version, the plugin's ``vendor_version``."""
    try:
        return version("strata")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0.0.0"


class Identity(csi_pb2_grpc.IdentityServicer):
    """Names the plugin, says it has no controller, and is ready once the spoke's mount is."""

    def __init__(self, volumes: Volumes, name: str = DRIVER_NAME) -> None:
        self.volumes, self.name = volumes, name

    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        """The driver name and Strata's version."""
        return csi_pb2.GetPluginInfoResponse(name=self.name, vendor_version=plugin_version())

    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        """None: no controller service (nothing to create or attach), no topology."""
        return csi_pb2.GetPluginCapabilitiesResponse()

    def Probe(
        self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ProbeResponse:
        """Ready when the spoke's mount is mounted; not ready (still OK) before."""
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=self.volumes.ready()))


class Node(csi_pb2_grpc.NodeServicer):
    """Publishes and unpublishes volumes on this node.

    Args:
        volumes: the node's publications.
        node_id: this node's name (the kubelet's, from the downward API).
        tenancy: which datasets each namespace's pods may mount (:mod:`csi.tenancy`).
        audit: where publishes and refusals are recorded; None records nothing.
    """

    def __init__(
        self,
        volumes: Volumes,
        node_id: str,
        tenancy: Tenancy,
        audit: AuditLog | None = None,
        hub: HubScope | None = None,
    ) -> None:
        self.volumes, self.node_id = volumes, node_id
        self.tenancy, self.audit, self.hub = tenancy, audit, hub

    def _admit(
        self, context: dict[str, str], secrets: dict[str, str], dataset: str, ref: str
    ) -> str:
        """The pod (``namespace/name``) once it may mount ``dataset``: by the volume's own
        token (its secret's ``token``, which the hub must accept for the dataset:
        :mod:`csi.hubscope`), or else by the tenancy policy.

        Raises:
            Denied: the kubelet named no namespace, the volume's token may not read the
                dataset, or no tenancy entry allows it (counted, audited).
            SpokeUnavailable: the hub could not be asked about the volume's token.
            Misconfigured: the hub refused this plugin's TLS.
        """
        namespace = context.get(f"{KUBELET_PREFIX}pod.namespace", "")
        account = context.get(f"{KUBELET_PREFIX}serviceAccount.name", "")
        pod = f"{namespace}/{context.get(f'{KUBELET_PREFIX}pod.name', '?')}"
        token = secrets.get("token", "").strip()
        if not namespace:
            allowed = False
            reason = "the kubelet named no pod namespace (the CSIDriver needs podInfoOnMount: true)"
        elif token:
            allowed, reason = self._token_may(token, dataset)
        else:
            decision = self.tenancy.decide(namespace, account, dataset)
            allowed, reason = decision.allowed, decision.reason
        if not allowed:
            PUBLISHES.labels("denied").inc()
            if self.audit is not None:
                self.audit.refused(
                    who=f"pod {pod} ({account or '?'})",
                    what=f"publish {dataset}@{ref}",
                    outcome="denied",
                    reason=reason,
                )
            raise Denied(f"pod {pod} may not mount dataset {dataset!r}: {reason}")
        return pod

    def _token_may(self, token: str, dataset: str) -> tuple[bool, str]:
        """Whether the volume's own token may read ``dataset``, as the hub answers.

        Raises:
            SpokeUnavailable: the hub did not answer (the kubelet retries).
            Misconfigured: the hub refused this plugin's TLS (the reason in one line).
        """
        if self.hub is None:
            return False, "the volume carries a token, and this plugin has no --hub to ask"
        try:
            answer = self.hub.check(token, dataset)
        except HubUnreachable as err:
            PUBLISHES.labels("failed").inc()
            raise SpokeUnavailable(str(err)) from None
        except HubRefused as err:
            PUBLISHES.labels("failed").inc()
            raise Misconfigured(f"cannot check the volume's token: {err}") from None
        if answer.allowed:
            return True, "the volume's token may read it"
        return False, f"the volume's token may not read it ({answer.reason})"

    @_mapped
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        """Bind the version ``ref`` names now read-only at ``target_path`` (see
        :meth:`csi.volumes.Volumes.publish`)."""
        _require(request.volume_id, "volume_id")
        _require_path(request.target_path)
        if not request.HasField("volume_capability"):
            raise InvalidVolume("volume_capability is required")
        capability = request.volume_capability
        if capability.HasField("block"):
            raise InvalidVolume("block volumes are not supported: a Strata volume is a directory")
        if capability.mount.mount_flags:
            raise InvalidVolume(
                f"mount flags are not supported: {list(capability.mount.mount_flags)}"
            )
        if not request.readonly:
            raise InvalidVolume(
                "a Strata volume is read-only: set readOnly: true on the csi volume source"
            )
        context = dict(request.volume_context)
        dataset, ref = _attributes(context)
        pod = self._admit(context, dict(request.secrets), dataset, ref)
        try:
            published = self.volumes.publish(
                request.volume_id, request.target_path, dataset, ref, for_pod=pod
            )
        except VolumeError:
            PUBLISHES.labels("failed").inc()
            raise
        PUBLISHES.labels("ok").inc()
        if self.audit is not None:
            self.audit.record(
                who=f"pod {pod}",
                what=f"publish {dataset}@{ref}",
                outcome="ok",
                version=published.version,
                target=published.target,
            )
        return csi_pb2.NodePublishVolumeResponse()

    @_mapped
    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        """Unmount and remove ``target_path``; OK when it is not there."""
        _require(request.volume_id, "volume_id")
        _require_path(request.target_path)
        self.volumes.unpublish(request.volume_id, request.target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        """None: no staging (publish binds straight from the mount), no stats, no expansion."""
        return csi_pb2.NodeGetCapabilitiesResponse()

    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        """This node's id and how many volumes it takes (:data:`MAX_NODE_VOLUMES`); no
        topology."""
        return csi_pb2.NodeGetInfoResponse(
            node_id=self.node_id, max_volumes_per_node=MAX_NODE_VOLUMES
        )


def _require(value: str, field: str) -> None:
    if not value:
        raise InvalidVolume(f"{field} is required")


def _require_path(path: str) -> None:
    _require(path, "target_path")
    if not path.startswith("/") or "\0" in path:
        raise InvalidVolume(f"target_path must be an absolute path, not {path!r}")


def _attributes(context: dict[str, str]) -> tuple[str, str]:
    """``(dataset, ref)`` from a volume's attributes.

    Raises:
        InvalidVolume: an attribute is missing or malformed, or an unknown one is given.
    """
    unknown = sorted(k for k in context if k not in ATTRIBUTES and not k.startswith(KUBELET_PREFIX))
    if unknown:
        raise InvalidVolume(
            f"unknown volume attributes {unknown}: a Strata volume takes {list(ATTRIBUTES)}"
        )
    values = []
    for key in ATTRIBUTES:
        value = context.get(key, "")
        if not value:
            raise InvalidVolume(f"volume attribute {key!r} is required (e.g. dataset: f3, ref: v3)")
        if not NAME.fullmatch(value):
            raise InvalidVolume(
                f"volume attribute {key}={value[:80]!r} is no valid name "
                "(1-64 of a-z 0-9 . _ -, starting with a letter or digit)"
            )
        values.append(value)
    return values[0], values[1]
