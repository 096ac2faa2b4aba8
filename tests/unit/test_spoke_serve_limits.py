"""The connection caps fitted under the open-file limit (spoke/serve/limits.py)."""

from __future__ import annotations

from spoke.serve.limits import ADMIN_MAX_CONNECTIONS, PEER_FILES, ConnectionCaps


def test_the_caps_asked_for_stand_where_the_limit_allows_them() -> None:
    caps = ConnectionCaps.fit(65_536, peer=1024)
    assert caps == ConnectionCaps(admin=ADMIN_MAX_CONNECTIONS, peer=1024)


def test_systemds_default_limit_lowers_both_caps_and_leaves_descriptors_free() -> None:
    caps = ConnectionCaps.fit(1024, peer=1024)
    assert caps == ConnectionCaps(admin=128, peer=1024 // PEER_FILES)
    # seven descriptors a peer connection through the door, one an admin connection
    assert 1024 - (7 * caps.peer + caps.admin) >= 1024 // 4


def test_no_peer_port_and_a_floor_of_eight() -> None:
    assert ConnectionCaps.fit(1024, peer=0).peer == 0
    assert ConnectionCaps.fit(16, peer=1024) == ConnectionCaps(admin=8, peer=8)
