"""Generated gRPC packages; see protocol/gen.py."""
