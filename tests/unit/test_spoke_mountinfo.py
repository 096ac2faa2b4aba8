"""The mount table as the supervisor and the mount read it (/proc/self/mountinfo)."""

from __future__ import annotations

import os
from pathlib import Path

from spoke.disk.mountinfo import Mount, mounted_paths, mounts

TABLE = (
    "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "40 22 0:45 / /mnt/with\\040space rw,nosuid - fuse.strata strata rw\n"
    "41 40 0:46 / /mnt/with\\040space rw,nosuid - fuse.strata strata rw\n"
    "short line\n"
)


def test_lines_are_parsed_and_unescaped_in_order(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(TABLE)
    assert mounts(str(table)) == [
        Mount("0:21", "/"),
        Mount("0:45", "/mnt/with space"),
        Mount("0:46", "/mnt/with space"),  # stacked on top: after the one below
    ]


def test_non_ascii_and_non_utf8_names_read_as_python_names_them(tmp_path: Path) -> None:
    # the kernel escapes only space, tab, newline and backslash; other bytes come raw
    table = tmp_path / "mountinfo"
    table.write_bytes(
        "50 22 0:47 / /var/lib/kubelet/pods/x/volumes/données\\134\\040é rw - ext4 a rw\n".encode()
        + b"51 22 0:48 / /mnt/latin-\xe9 rw - ext4 b rw\n"
    )
    found = mounts(str(table))
    assert [m.mountpoint for m in found] == [
        "/var/lib/kubelet/pods/x/volumes/données\\ é",
        os.fsdecode(b"/mnt/latin-\xe9"),
    ]
    assert Path(found[0].mountpoint) == Path("/var/lib/kubelet/pods/x/volumes") / "données\\ é"


def test_the_real_table_has_the_root() -> None:
    assert "/" in {m.mountpoint for m in mounts()}
    assert "/" in mounted_paths()
