"""``fit --hints URL``: each upcoming epoch's read order is posted, the first steps' keys
first; posting never holds training up (the first read happens before the plan is fully
posted); failures never stop a run."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.component.trainer_support import f3_mdio_fixture  # noqa: F401  (the f3_mdio fixture)
from trainer import train
from trainer.dataloader import build_dataset
from trainer.dataset import PatchDataset
from trainer.hints import HintTarget, default_stream
from trainer.options import FitOptions
from trainer.presets import get_preset
from trainer.readorder import epoch_read_order
from trainer.synth import synth
from trainer.synthspec import SynthSpec
from trainer.train import fit


class _Recorder(BaseHTTPRequestHandler):
    posts: ClassVar[list[tuple[str, dict[str, Any], str]]] = []
    deletes: ClassVar[list[str]] = []
    hold: ClassVar[threading.Event | None] = None  # set: answer the first post
    held: ClassVar[list[bool]] = []  # per post held: whether ``hold`` was set in time

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if _Recorder.hold is not None and not _Recorder.posts:
            _Recorder.held.append(_Recorder.hold.wait(HOLD_S))
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


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic volume of 3x3x2 chunks: one step reads most of them, not all."""
    out = tmp_path_factory.mktemp("hints") / "synth.mdio"
    synth(out, SynthSpec(shape=(40, 36, 64), chunks=(16, 16, 32), seed=2, dead_fraction=0.05))
    return out


HOLD_S = 30.0
"""How long the recorder holds the first post back waiting for a read (a trainer that
posts before it reads never reads meanwhile: the post is then answered late, and counted
as not held)."""


@pytest.fixture
def server() -> Iterator[str]:
    _Recorder.posts = []
    _Recorder.deletes = []
    _Recorder.hold = None
    _Recorder.held = []
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


def test_fit_posts_each_upcoming_epoch(
    volume: Path, tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(train, "HINT_HEAD_STEPS", 1)  # an epoch here is 8 steps
    target = HintTarget(server, "synth", "v1", "synth.mdio", token="tok")
    opts = FitOptions(
        data=volume,
        out=tmp_path / "run",
        steps=12,
        workers=0,
        epoch_size=64,
        threads=1,
        hints=target,
    )
    fit(opts, echo=lambda _: None)
    posts = _Recorder.posts
    # epoch 0's first 2 steps, the rest of epoch 0, epoch 1, then 2 at the rollover
    assert [p for p, _, _ in posts] == ["/v1/hints"] * 4
    assert [b["append"] for _, b, _ in posts] == [False, True, True, True]
    assert all(auth == "Bearer tok" for _, _, auth in posts)
    stream = default_stream(tmp_path / "run") + ".rank0"
    assert all(body["stream"] == stream for _, body, _ in posts)
    assert _Recorder.deletes == [f"/v1/hints/{stream}"]  # the plan ends with the run
    config = get_preset("tiny")
    info, _, plan = build_dataset(opts, config, config.batch_size, world_size=1)
    assert all(body["dataset"] == "synth" and body["ref"] == "v1" for _, body, _ in posts)
    paths = [body["paths"] for _, body, _ in posts]

    def order(epoch: int, steps: int | None = None) -> list[str]:
        return ["synth.mdio/" + k for k in epoch_read_order(plan, info, epoch, 0, steps=steps)]

    assert paths[0] == order(0, steps=1) and 0 < len(paths[0]) < len(order(0))
    assert paths[0] + paths[1] == order(0)  # the two parts plan exactly epoch 0
    assert paths[2] == order(1) and paths[3] == order(2)


def test_the_first_read_happens_before_the_plan_is_fully_posted(
    volume: Path, tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service holds the first post unanswered until the trainer has read a patch: a
    trainer that waited for its posts before reading would read nothing meanwhile."""
    _Recorder.hold = threading.Event()
    reads: list[int] = []
    posted_at_first_read: list[int] = []
    read_patch = PatchDataset.read_patch

    def reading(self: PatchDataset, corner: Sequence[int]) -> Any:
        if not reads:
            posted_at_first_read.append(len(_Recorder.posts))
        reads.append(1)
        assert _Recorder.hold is not None
        _Recorder.hold.set()
        return read_patch(self, corner)

    monkeypatch.setattr(PatchDataset, "read_patch", reading)
    monkeypatch.setattr(train, "HINT_HEAD_STEPS", 1)
    target = HintTarget(server, "synth", "v1", "synth.mdio")
    opts = FitOptions(
        data=volume,
        out=tmp_path / "run",
        steps=4,
        workers=0,
        epoch_size=64,
        threads=1,
        hints=target,
    )
    summary = fit(opts, echo=lambda _: None)
    assert summary["steps"] == 4 and reads
    assert posted_at_first_read == [0]  # no post had been answered at the first read
    assert _Recorder.held == [True]  # the first post was answered after a read, not on timeout
    # all of it, in order: epoch 0's first step, the rest of epoch 0, epoch 1
    assert [b["append"] for _, b, _ in _Recorder.posts] == [False, True, True]
    stream = default_stream(tmp_path / "run") + ".rank0"
    assert _Recorder.deletes == [f"/v1/hints/{stream}"]


def test_unreachable_hint_service_does_not_stop_training(f3_mdio: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    target = HintTarget("http://127.0.0.1:9", "f3", "v1", "f3.mdio")  # discard port: refused
    summary = fit(
        FitOptions(data=f3_mdio, out=tmp_path / "run", steps=3, workers=0, threads=1, hints=target),
        echo=lines.append,
    )
    assert summary["steps"] == 3
    assert any(line.startswith("hints: not posted") for line in lines)
