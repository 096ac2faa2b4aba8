"""Listen addresses of the form ``HOST:PORT`` (IPv6 hosts in brackets: ``[::1]:50051``).

The syntax is parsed by :func:`protocol.address.parse_hostport`, shared with the spoke.
"""

from __future__ import annotations

from dataclasses import dataclass

from hub.errors import InvalidArgument
from protocol.address import parse_hostport


@dataclass(frozen=True, slots=True)
class Address:
    """A TCP listen address.

    Attributes:
        host: Host name or IP address, without brackets.
        port: TCP port, 0 to 65535 (0 asks the kernel for a free port).
    """

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        """Parses ``HOST:PORT``.

        Args:
            text: E.g. ``"127.0.0.1:50051"``, ``"localhost:0"`` or ``"[::1]:0"``.

        Returns:
            The address.

        Raises:
            InvalidArgument: ``text`` is not ``HOST:PORT`` with a port from 0 to 65535.
        """
        try:
            host, port = parse_hostport(text)
        except ValueError:
            raise InvalidArgument(
                f"invalid address {text!r}: expected HOST:PORT with a port from 0 to 65535"
            ) from None
        return cls(host, port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"
