"""Every gRPC core option Strata sets is one gRPC core knows: it ignores a name it does not
know without a word. The hub set ``grpc.http2.min_recv_ping_interval_without_data_ms``
(the C macro's name, not its string), so its ping policy stayed at five minutes and it
answered a spoke's 10 s keepalive pings with GOAWAY ``too_many_pings`` about a minute
after each connection began (issue 39's sixteenth probe)."""

from __future__ import annotations

import re
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hub", "spoke", "csi", "fusemount", "strata_local", "protocol", "bench")
OPTION = re.compile(r'\(\s*"(grpc\.[a-z0-9_.]+)"\s*,')  # ("grpc.name", value)


def _core() -> bytes:
    library = next((Path(grpc.__file__).parent / "_cython").glob("cygrpc*.so"))
    return library.read_bytes()


def test_every_core_option_set_is_one_grpc_core_knows() -> None:
    names = {
        name
        for package in PACKAGES
        for source in (ROOT / package).rglob("*.py")
        for name in OPTION.findall(source.read_text())
    }
    assert "grpc.http2.min_ping_interval_without_data_ms" in names  # the scan sees them
    core = _core()
    unknown = sorted(name for name in names if name.encode() + b"\0" not in core)
    assert unknown == []
