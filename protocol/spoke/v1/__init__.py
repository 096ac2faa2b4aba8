"""protocol.spoke.v1: the spoke daemon's local service (spoke.proto) and its generated modules."""
