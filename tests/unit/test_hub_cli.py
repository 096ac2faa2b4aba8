"""``strata-hub`` commands run in-process through ``hub.cli.main.main``: output and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.cli.main import main


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a" * 300)
    (src / "sub" / "b.txt").write_bytes(b"b")
    return src


def one_line_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("strata-hub: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_publish_prints_the_version(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "data")
    assert main(["publish", "--data-dir", data, "f3", str(tree)]) == 0
    assert capsys.readouterr().out == "v1\n"
    assert main(["publish", "--data-dir", data, "f3", str(tree), "--tag", "stable"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "v2\n"
    assert captured.err.startswith(
        "strata-hub: published f3 v2 (tag stable): 2 files, 301 bytes, 0 new blocks"
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["f3", "{missing}"], ["source dir", "does not exist"]),
        (["f3", "{tree}/a.bin"], ["is not a directory"]),
        (["F3", "{tree}"], ["invalid dataset name 'F3'"]),
        (["..", "{tree}"], ["invalid dataset name '..'"]),
        (["a/b", "{tree}"], ["invalid dataset name 'a/b'"]),
        (["f3", "{tree}", "--tag", "v1"], ["invalid tag name 'v1'"]),
        (["f3", "{tree}", "--tag", "Bad Tag"], ["invalid tag name"]),
        (["f3", "{tree}", "--block-size", "0"], ["invalid block size 0"]),
        (["f3", "{tree}", "--block-size", "lots"], ["--block-size"]),
        (["f3"], ["SRC_DIR"]),
    ],
)
def test_publish_errors(
    tree: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    fragments: list[str],
) -> None:
    data = tmp_path / "data"
    assert main(["publish", "--data-dir", str(data), "f3", str(tree)]) == 0
    capsys.readouterr()
    argv = [a.format(tree=tree, missing=tmp_path / "missing") for a in args]
    assert main(["publish", "--data-dir", str(data), *argv]) == 2
    one_line_error(capsys, *fragments)
    assert main(["ls", "--data-dir", str(data), "f3"]) == 0
    versions = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert versions == ["v1"], "a failed publish must not change the catalog"


def test_publish_requires_a_data_dir(
    tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STRATA_HUB_DATA_DIR", raising=False)
    assert main(["publish", "f3", str(tree)]) == 2
    one_line_error(capsys, "--data-dir")


def test_data_dir_from_the_environment(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_HUB_DATA_DIR", str(tmp_path / "data"))
    assert main(["publish", "f3", str(tree)]) == 0
    assert capsys.readouterr().out == "v1\n"


def test_ls(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "data")
    for dataset in ("f3", "f3", "other"):
        assert main(["publish", "--data-dir", data, dataset, str(tree)]) == 0
    capsys.readouterr()
    assert main(["ls", "--data-dir", data]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "DATASET  VERSIONS  LATEST",
        "f3       2         v2",
        "other    1         v1",
    ]
    assert main(["ls", "--data-dir", data, "f3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["VERSION", "CREATED", "FILES", "BYTES", "SNAPSHOT", "TAGS"]
    assert [line.split()[0] for line in lines[1:]] == ["v1", "v2"]
    assert lines[2].split()[-1] == "latest"
    assert len(lines[1].split()) == 5, "v1 has no tag"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["ls", "--data-dir", "{tmp}/absent"], ["data dir", "does not exist"]),
        (["ls", "--data-dir", "{tmp}"], ["no catalog"]),
        (["ls", "--data-dir", "{data}", "nope"], ["unknown dataset 'nope'"]),
        (["ls", "--data-dir", "{data}", "No"], ["invalid dataset name"]),
        (["serve", "--data-dir", "{tmp}/absent", "--listen", "127.0.0.1:0"], ["does not exist"]),
        (["serve", "--data-dir", "{tmp}", "--listen", "127.0.0.1:99999"], ["invalid address"]),
        (["serve", "--data-dir", "{tmp}", "--listen", "127.0.0.1"], ["invalid address"]),
        (["serve", "--data-dir", "{tmp}"], ["--listen"]),
        (["nonsense"], ["No such command"]),
        ([], ["Missing command"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tree: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    fragments: list[str],
) -> None:
    data = tmp_path / "data"
    assert main(["publish", "--data-dir", str(data), "f3", str(tree)]) == 0
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path, data=data) for a in args]
    assert main(argv) == 2
    one_line_error(capsys, *fragments)


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "publish" in capsys.readouterr().out


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://strata:s3cret-pw@127.0.0.1:1/strata",
        "postgresql://strata@127.0.0.1:1/strata?password=s3cret-pw",
        "postgresql://strata@127.0.0.1:1/strata?sslmode=disable&password=s3cret-pw",
        "postgres://127.0.0.1:1/strata?PASSWORD=s3cret-pw&user=strata",
    ],
)
def test_a_catalog_password_reaches_no_message_nor_the_audit_log(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The catalog is unreachable (port 1), or its URL malformed (libpq's parameter names
    are lower case): the one-line error and the audit record of the command name the
    catalog without its password."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    code = main(["tag", "--data-dir", str(data), "--catalog", url, "f3", "v1", "stable"])
    assert code in (1, 2)
    err = capsys.readouterr().err
    assert "127.0.0.1" in err and "s3cret" not in err
    audit = (data / "audit.jsonl").read_text()
    assert "--catalog" in audit and "***" in audit and "s3cret" not in audit


def test_redact_covers_the_forms_libpq_takes() -> None:
    from hub.catalog.locations import redact

    assert redact("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert redact("postgresql://u@h/db?password=pw&x=1") == "postgresql://u@h/db?password=***&x=1"
    assert redact("host=h user=u password='p w' dbname=d") == "host=h user=u password=*** dbname=d"
    assert (
        redact("postgresql://u@h/db?sslpassword=k&x=1") == "postgresql://u@h/db?sslpassword=***&x=1"
    )
    assert redact("postgresql://u@h/db?%70assword=s&ssl%70assword=t") == (
        "postgresql://u@h/db?%70assword=***&ssl%70assword=***"
    )
    assert redact("host=h password=pw") == "host=h password=***"
    assert redact("/var/lib/strata/catalog") == "/var/lib/strata/catalog"
