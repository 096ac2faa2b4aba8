"""protocol.csi.v1: the part of the Container Storage Interface a node plugin of ephemeral
inline volumes speaks (csi.proto), and its generated modules."""
