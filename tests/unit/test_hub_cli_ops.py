"""``strata-hub`` tag, untag, revoke, gc, verify, publish --version and ls --all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hub.catalog import Catalog
from hub.cli.main import app, main


@pytest.fixture
def data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"first")
    data = tmp_path / "data"
    assert main(["publish", "--data-dir", str(data), "f3", str(src)]) == 0
    (src / "a.txt").write_bytes(b"second")
    assert main(["publish", "--data-dir", str(data), "f3", str(src)]) == 0
    capsys.readouterr()
    return data


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_documents_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    import typer

    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert commands == {
        *("serve", "publish", "tag", "untag", "revoke", "gc", "verify", "ls", "token", "keygen"),
        "migrate",
    }
    for name in commands:
        assert re.search(rf"│ {name}\s+\S", out), f"{name} has no help line"
        code, sub, _ = run(capsys, name, "--help")
        # `token` manages the token file (--tokens FILE), `keygen` writes a key pair
        want = {"token": "--tokens", "keygen": "PRIVATE"}.get(name, "--data-dir")
        assert code == 0 and want in sub


def test_tag_untag_revoke(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(data)
    assert run(capsys, "tag", "--data-dir", d, "f3", "v1", "stable")[2] == (
        "strata-hub: f3 stable -> v1\n"
    )
    assert run(capsys, "untag", "--data-dir", d, "f3", "stable")[2] == (
        "strata-hub: f3: removed tag stable (was v1)\n"
    )
    code, _, err = run(capsys, "revoke", "--data-dir", d, "f3", "v2")
    assert code == 0 and "revoked f3 v2 (tags removed: latest)" in err
    code, out, _ = run(capsys, "ls", "--data-dir", d, "f3", "--all")
    rows = [line.split() for line in out.splitlines()]
    assert rows[0][-1] == "STATE"
    assert [(row[0], row[-1]) for row in rows[1:]] == [("v1", "live"), ("v2", "revoked")]
    code, out, _ = run(capsys, "ls", "--data-dir", d, "f3")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["v1"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tag", "f3", "v9", "x"], "no version v9"),
        (["tag", "f3", "v1", "v2"], "invalid tag name 'v2'"),
        (["tag", "f3", "v1", "../x"], "invalid tag name"),
        (["untag", "f3", "nope"], "no tag 'nope'"),
        (["revoke", "f3", "latest"], "invalid version 'latest'"),
        (["revoke", "f3", "v7"], "no version v7"),
        (["revoke", "nope", "v1"], "unknown dataset 'nope'"),
        (["verify", "f3", "v9"], "no version v9"),
        (["publish", "f3", "{src}", "--version", "v1"], "f3 v1 is already published"),
        (["publish", "f3", "{src}", "--version", "v5"], "the next version is v3, not v5"),
        (["gc", "--blobs", "s3://"], "expected s3://BUCKET"),
        (["gc", "--blobs", "{other}"], "keeps its blocks in"),
    ],
)
def test_refusals_are_one_line_exit_2(
    data: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    argv = [a.format(src=data.parent / "src", other=data.parent / "other") for a in args]
    code, out, err = run(capsys, argv[0], "--data-dir", str(data), *argv[1:])
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and fragment in err, err


def test_revoke_twice_is_refused(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "revoke", "--data-dir", str(data), "f3", "v1")[0] == 0
    code, _, err = run(capsys, "revoke", "--data-dir", str(data), "f3", "v1")
    assert code == 2 and "already revoked" in err


def test_gc_and_verify(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(data)
    code, out, _ = run(capsys, "verify", "--data-dir", d, "f3", "latest", "--blocks")
    assert code == 0 and re.fullmatch(r"f3 v2 [0-9a-f]{32} ok, 1 blocks\n", out)
    assert run(capsys, "revoke", "--data-dir", d, "f3", "v1")[0] == 0
    code, _, err = run(capsys, "gc", "--data-dir", d)  # a week's grace by default
    assert code == 0 and "scanned 2 blobs, deleted 0, 1 unreferenced within the 604800 s" in err
    code, _, err = run(capsys, "gc", "--data-dir", d, "--dry-run", "--grace", "0")
    assert "scanned 2 blobs, would delete 1" in err
    code, _, err = run(capsys, "gc", "--data-dir", d, "--keep-events", "1", "--grace", "0")
    assert code == 0 and "scanned 2 blobs, deleted 1" in err and "events pruned" in err
    assert run(capsys, "gc", "--data-dir", d)[2].startswith("strata-hub: gc: scanned 1 blobs")
    with Catalog(data / "catalog") as catalog:
        assert catalog.first_sequence() == catalog.last_sequence()
    # A damaged block: verify fails with exit 1 and names it.
    (blob,) = [p for p in (data / "blobs").glob("??/*") if p.is_file()]  # not gc's note
    blob.write_bytes(b"tampered")
    code, out, err = run(capsys, "verify", "--data-dir", d, "f3", "v2", "--blocks")
    assert code == 1 and "1 corrupt blocks" in err and blob.name in err
    assert run(capsys, "verify", "--data-dir", d, "f3", "v2")[0] == 0, "the manifest is intact"


def test_ls_lists_a_directory_through_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    (src / "shard" / "deep").mkdir(parents=True)
    for i in range(5):
        (src / "shard" / f"s{i}.npy").write_bytes(b"x" * (i + 1))
    (src / "top.txt").write_bytes(b"hello")
    (src / "link").symlink_to("top.txt")
    d = str(tmp_path / "data")
    assert main(["publish", "--data-dir", d, "f3", str(src)]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "ls", "--data-dir", d, "f3", "latest")
    rows = [line.split() for line in out.splitlines()]
    assert code == 0 and rows[0] == ["TYPE", "SIZE", "NAME"]
    assert rows[1:] == [
        ["symlink", "-", "link"],
        ["directory", "-", "shard"],
        ["file", "5", "top.txt"],
    ]
    monkeypatch.setattr("hub.cli.catalog.LS_PAGE", 2)  # several pages, nothing lost or repeated
    code, out, _ = run(capsys, "ls", "--data-dir", d, "f3", "v1", "shard")
    names = [line.split()[-1] for line in out.splitlines()[1:]]
    assert code == 0 and names == ["deep", "s0.npy", "s1.npy", "s2.npy", "s3.npy", "s4.npy"]
    assert out.splitlines()[2].split() == ["file", "1", "s0.npy"]
    code, _, err = run(capsys, "ls", "--data-dir", d, "f3", "v1", "top.txt")
    assert code == 2 and err == "strata-hub: error: 'top.txt' is not a directory\n"
    code, _, err = run(capsys, "ls", "--data-dir", d, "f3", "v1", "nope")
    assert code == 2 and "no entry 'nope'" in err
    code, _, err = run(capsys, "ls", "--data-dir", d, "f3", "v9")
    assert code == 2 and "no version v9" in err
