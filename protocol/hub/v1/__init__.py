"""protocol.hub.v1: the hub service (hub.proto) and its generated modules."""
