"""spoke package."""
