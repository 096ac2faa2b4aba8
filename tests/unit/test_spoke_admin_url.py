"""A stopping daemon removes ``admin.url`` only while it names its own admin API: a
successor's daemon may have written its own there already (succession)."""

from __future__ import annotations

from pathlib import Path

from spoke.run.daemon import _unlink_if_ours


def test_a_daemon_removes_only_its_own_admin_url(tmp_path: Path) -> None:
    path = tmp_path / "admin.url"
    path.write_text("http://127.0.0.1:2000\n")  # the successor's, written after ours
    _unlink_if_ours(path, "http://127.0.0.1:1000")
    assert path.read_text() == "http://127.0.0.1:2000\n"
    _unlink_if_ours(path, "http://127.0.0.1:2000")
    assert not path.exists()
    _unlink_if_ours(path, "http://127.0.0.1:2000")  # gone already: nothing to do
