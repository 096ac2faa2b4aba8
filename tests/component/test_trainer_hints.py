"""``fit --hints URL``: each upcoming epoch's read order is posted; failures never stop a run."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.component.test_trainer_cli import f3_mdio  # noqa: F401  (fixture)
from trainer.hints import HintTarget, default_stream
from trainer.presets import get_preset
from trainer.readorder import epoch_read_order
from trainer.train import FitOptions, build_dataset, fit


class _Recorder(BaseHTTPRequestHandler):
    posts: ClassVar[list[tuple[str, dict[str, Any], str]]] = []
    deletes: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Recorder.posts.append((self.path, body, self.headers.get("Authorization", "")))
        self._reply(202)

    def do_DELETE(self) -> None:
        _Recorder.deletes.append(self.path)
        self._reply(200)

    def _reply(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Recorder.posts = []
    _Recorder.deletes = []
    httpd = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_target_defaults_come_from_the_mount_path(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("abc\n")
    t = HintTarget.for_path("http://x/", Path("/mnt/strata/f3/latest/f3.mdio"), token_file=token)
    assert (t.url, t.dataset, t.ref, t.prefix, t.token, t.stream) == (
        "http://x",
        "f3",
        "latest",
        "f3.mdio",
        "abc",
        None,
    )


@pytest.mark.parametrize("name", ["", "Upper", "-x", "a/b", "x" * 52])
def test_bad_stream_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="hint stream"):
        HintTarget.for_path("http://x", Path("/m/f3/v1/f3.mdio"), stream=name)


def test_default_stream_is_per_output_directory(tmp_path: Path) -> None:
    a, b = default_stream(tmp_path / "a"), default_stream(tmp_path / "b")
    assert a != b and a == default_stream(tmp_path / "a") and a.startswith("fit-")


def test_fit_posts_each_upcoming_epoch(f3_mdio: Path, tmp_path: Path, server: str) -> None:  # noqa: F811
    target = HintTarget(server, "f3", "v1", "f3.mdio", token="tok")
    opts = FitOptions(
        data=f3_mdio,
        out=tmp_path / "run",
        steps=12,
        workers=0,
        epoch_size=64,
        threads=1,
        hints=target,
    )
    fit(opts, echo=lambda _: None)
    posts = _Recorder.posts
    assert [p for p, _, _ in posts] == ["/v1/hints"] * 3  # epochs 0 and 1, then 2 at the rollover
    assert [b["append"] for _, b, _ in posts] == [False, True, True]
    assert all(auth == "Bearer tok" for _, _, auth in posts)
    stream = default_stream(tmp_path / "run") + ".rank0"
    assert all(body["stream"] == stream for _, body, _ in posts)
    assert _Recorder.deletes == [f"/v1/hints/{stream}"]  # the plan ends with the run
    config = get_preset("tiny")
    info, _, plan = build_dataset(opts, config, config.batch_size, world_size=1)
    for epoch, (_, body, _) in enumerate(posts):
        assert body["dataset"] == "f3" and body["ref"] == "v1"
        expected = ["f3.mdio/" + k for k in epoch_read_order(plan, info, epoch, 0)]
        assert body["paths"] == expected and expected


def test_unreachable_hint_service_does_not_stop_training(f3_mdio: Path, tmp_path: Path) -> None:  # noqa: F811
    lines: list[str] = []
    target = HintTarget("http://127.0.0.1:9", "f3", "v1", "f3.mdio")  # discard port: refused
    summary = fit(
        FitOptions(data=f3_mdio, out=tmp_path / "run", steps=3, workers=0, threads=1, hints=target),
        echo=lines.append,
    )
    assert summary["steps"] == 3
    assert any(line.startswith("hints: not posted") for line in lines)
