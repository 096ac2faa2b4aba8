"""What a publisher signs: the bytes of a snapshot signature (Ed25519, RFC 8032).

The hub's publisher signs, and a spoke given the publisher's public key checks,
``b"strata-snapshot-signature\\0" | format u16 (=1) | dataset | NUL | version | NUL |
snapshot id (16 raw bytes)``: the snapshot's name bound to its content address, so a hub
cannot serve another tree under a signed name, nor a signed tree under another name. The
64-byte signature travels in ``Snapshot.signature`` (``hub.proto``).

The snapshot id is xxh3-128 (not collision resistant), so the signature is as strong as
that digest against someone who can choose the bytes of a second tree: it stops a
compromised or impersonated hub from serving an arbitrary tree, not a forger who crafts
an xxh3 collision (``spoke/DESIGN.md``, "Trust model").
"""

from __future__ import annotations

import struct

FORMAT = 1
_HEADER = b"strata-snapshot-signature\0" + struct.pack(">H", FORMAT)
SIGNATURE_BYTES = 64


def signed_message(dataset: str, version: str, snapshot_id: str) -> bytes:
    """The bytes signed for ``dataset`` ``version`` with ``snapshot_id`` (32 hex chars).

    Raises:
        ValueError: ``snapshot_id`` is not 32 hex characters, or a name holds a NUL.
    """
    raw = bytes.fromhex(snapshot_id)
    if len(raw) != 16:
        raise ValueError(f"snapshot id {snapshot_id!r} is not 16 bytes")
    if "\0" in dataset or "\0" in version:
        raise ValueError("dataset and version names never hold NUL")
    return _HEADER + dataset.encode() + b"\0" + version.encode() + b"\0" + raw
