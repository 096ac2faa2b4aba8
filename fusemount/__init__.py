"""fusemount package."""
