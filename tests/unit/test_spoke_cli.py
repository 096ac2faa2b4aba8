"""``strata-spoke`` refuses bad settings with one line and exit status 2, starting nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _spoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoke", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--cache-dir": "LONG"}, "is too long: the daemon's socket"),
        ({"--cache-size": "0"}, "--cache-size must be positive"),
        ({"--hub": "nohost"}, "--hub must be HOST:PORT"),
        ({"--metrics": "nohost"}, "--metrics must be HOST:PORT"),
        ({"--log-level": "bogus"}, "--log-level: 'bogus' is not one of DEBUG"),
        ({"--policy": "fifo"}, "--policy: Input should be 'arc', 'lru', 's3fifo' or 'sieve'"),
        ({"--background-fill": "sometimes"}, "--background-fill: Input should be 'auto' or 'off'"),
        ({"--fill-rate": "0"}, "--fill-rate must be a positive size per second"),
        ({"--fill-rate": "fast"}, "--fill-rate: "),
        ({"--hub-bulk-port": "1"}, "--hub-bulk-port 1 is the hub's gRPC port"),
    ],
)
def test_bad_settings_are_one_line_errors(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cache = tmp_path / "cache"
    if change.get("--cache-dir") == "LONG":
        change = {"--cache-dir": str(tmp_path / ("d" * 120))}
    flags = {"--hub": "127.0.0.1:1", "--cache-dir": str(cache), "--cache-size": "1GiB"}
    flags.update(change)
    argv = [x for kv in flags.items() for x in kv]
    proc = _spoke("run", *argv, "--mount", str(mnt), "--admin", "127.0.0.1:0")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata-spoke: error:")
    assert message in lines[0]
    assert not cache.exists()  # nothing started, nothing written


def test_prewarm_with_an_empty_ref_is_refused_before_any_request() -> None:
    proc = _spoke("prewarm", "--admin", "http://127.0.0.1:9", "ds@")  # discard port: refused
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "strata-spoke: error: 'ds@': give a version or tag after '@', or leave '@' out for latest"
    )


def test_every_policy_is_a_choice_and_the_default_is_the_registrys() -> None:
    """The CLI and the settings offer exactly the policies spoke.cache.registry builds, and
    default to the one spoke/DESIGN.md says was chosen by measurement."""
    import inspect
    import typing

    from spoke.cache.registry import DEFAULT_POLICY, POLICIES
    from spoke.run import cli
    from spoke.run.settings import SpokeSettings

    field = SpokeSettings.model_fields["policy"]
    assert set(typing.get_args(field.annotation)) == set(POLICIES)
    assert field.default == DEFAULT_POLICY
    # `run` and `daemon` leave an option they were not given to the settings (environment,
    # config file, then the settings' default), so the default has one home
    for command in (cli.run, cli.daemon):
        assert inspect.signature(command).parameters["policy"].default is None


def test_lock_holder_names_a_live_holder_only(tmp_path: Path) -> None:
    from spoke.run import lock

    path = tmp_path / "daemon.lock"
    assert lock.holder(path) is None  # no file
    fd = lock.hold(path, "test")
    os.close(fd)
    assert lock.holder(path) is None  # the file names a pid, but nobody holds it
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from spoke.run import lock; "
         f"lock.hold(Path({str(path)!r}), 'x'); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        assert lock.holder(path) == child.pid
    finally:
        child.kill()
        child.wait()
    assert lock.holder(path) is None


def _region(tmp_path: Path) -> dict[str, str]:
    """The files of a region's peer flags (deploy.pki), by flag."""
    from deploy.pki import region_flags

    flags = region_flags(tmp_path / "region")
    return dict(zip(flags[::2], flags[1::2], strict=True))


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ((), "--peer-listen without --peer-cert/--peer-key would serve blocks in cleartext"),
        (("--peer-cert", "--peer-key"), "--peer-listen without --peer-token-file"),
        (("--peer-token-file", "--peer-cert"), "--peer-cert and --peer-key go together"),
        (("--peer-insecure", "--peer-server-name"), "--peer-server-name needs TLS"),
        (("--peer-insecure", "--peer-grant-key"), "--peer-grant-key"),
        (("--peer-insecure", "MISMATCH"), "does not match --peer-cert"),
        (("NO-LISTEN", "--peer-insecure"), "need --peer-listen"),
    ],
)
def test_the_peer_port_needs_tls_and_a_token_unless_insecure(
    tmp_path: Path, given: tuple[str, ...], message: str
) -> None:
    """A plaintext or tokenless peer port is refused at start unless --peer-insecure."""
    files = _region(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cache = tmp_path / "cache"
    argv = ["run", "--hub", "127.0.0.1:1", "--cache-dir", str(cache), "--cache-size", "1GiB"]
    argv += ["--mount", str(mnt), "--admin", "127.0.0.1:0"]
    if "NO-LISTEN" not in given:
        argv += ["--peer-listen", "127.0.0.1:7879"]
    for flag in given:
        if flag == "--peer-insecure":
            argv.append(flag)
        elif flag == "--peer-server-name":
            argv += [flag, "spokes.example"]
        elif flag == "--peer-grant-key":
            argv += [flag, files["--peer-cert"]]  # a certificate, not an Ed25519 key
        elif flag == "MISMATCH":
            argv += ["--peer-cert", files["--peer-cert"], "--peer-key", files["--peer-key"]]
            argv[-1] = str(tmp_path / "region" / "region-ca.key")  # another key
        elif flag in files:
            argv += [flag, files[flag]]
    proc = _spoke(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata-spoke: error:"), lines
    assert message in lines[0]
    assert not cache.exists()
