"""A systemd service as systemd would start it, without systemd: a unit's directives merged
with its drop-ins, its environment and ``ExecStart=`` resolved, and its credentials
copied, so a test can run the unit's own command line as its own unprivileged user.

What is emulated (systemd.unit(5), systemd.exec(5), systemd.service(5)), and only that:
drop-ins ``NAME.service.d/*.conf`` applied in lexical order after the unit, an empty
assignment resetting a list; the specifiers ``%d`` (the credentials directory) and ``%%``
(anything else is refused, so the emulation never guesses); the environment built as
``Environment=``, then ``EnvironmentFile=`` over it, then ``UnsetEnvironment=`` removing
names last, whatever set them; ``${VAR}`` in ``ExecStart=`` replaced by one word;
``LoadCredential=ID:PATH`` copied into a directory only the service's user (and root)
reads, each file 0400 and the directory 0500 (systemd gives the user an ACL entry, or the
files, where ACLs are missing; here it owns them), a missing source failing the start as
it fails the unit.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

SPECIFIER = re.compile(r"%(.)")
VARIABLE = re.compile(r"\$\{(\w+)\}")


def unit_files(unit: Path) -> list[Path]:
    """The unit and its drop-ins, in the order systemd applies them."""
    return [unit, *sorted((unit.parent / f"{unit.name}.d").glob("*.conf"))]


def directives(unit: Path) -> dict[str, list[str]]:
    """Every directive of ``unit`` and its drop-ins (sections ignored: the names do not
    repeat across them here), continuation lines joined; an empty value resets."""
    out: dict[str, list[str]] = {}
    for path in unit_files(unit):
        for line in path.read_text().replace("\\\n", " ").splitlines():
            key, sep, value = line.partition("=")
            if not sep or line.startswith(("#", ";", "[")):
                continue
            key, value = key.strip(), value.strip()
            if value:
                out.setdefault(key, []).append(value)
            else:
                out[key] = []
    return out


def specifiers(value: str, credentials: Path) -> str:
    """``value`` with ``%d`` and ``%%`` resolved.

    Raises:
        ValueError: another specifier (this emulation does not know it).
    """

    def one(match: re.Match[str]) -> str:
        if match.group(1) == "d":
            return str(credentials)
        if match.group(1) == "%":
            return "%"
        raise ValueError(f"specifier %{match.group(1)} is not emulated")

    return SPECIFIER.sub(one, value)


def environment_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of an ``EnvironmentFile=`` (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith(("#", ";")):
            out[key.strip()] = value.strip().strip("\"'")
    return out


@dataclass(frozen=True)
class Service:
    """A unit's start, resolved.

    Attributes:
        argv: ``ExecStart=`` as words, ``${VAR}`` replaced.
        env: The environment the process gets.
        credentials: The credentials directory, filled.
    """

    argv: list[str]
    env: dict[str, str]
    credentials: Path


def prepare(
    unit: Path,
    *,
    etc: dict[str, Path],
    credentials: Path,
    state: Path,
    uid: int,
    gid: int,
    bindir: Path,
) -> Service:
    """Resolves ``unit`` (with its drop-ins) as systemd would start it.

    Args:
        unit: The unit file; its drop-ins are beside it.
        etc: Where each absolute path the unit names (``EnvironmentFile=``,
            ``LoadCredential=`` sources) is found here instead.
        credentials: The credentials directory to fill (made, owned by ``uid``).
        state: The value of ``$STATE_DIRECTORY``.
        uid: The service's user, owner of the credentials.
        gid: Its group.
        bindir: What ``/opt/strata/bin`` is here.

    Raises:
        FileNotFoundError: a credential's source or the environment file is missing
            (systemd fails the start: 243/CREDENTIALS, or 226/NAMESPACE).
    """
    found = directives(unit)
    credentials.mkdir(mode=0o700)
    for entry in found.get("LoadCredential", []):
        name, _, source = entry.partition(":")
        target = credentials / name
        shutil.copyfile(etc[source], target)
        os.chown(target, uid, gid)
        target.chmod(0o400)
    os.chown(credentials, uid, gid)
    credentials.chmod(0o500)

    env = {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "STATE_DIRECTORY": str(state),
        "CREDENTIALS_DIRECTORY": str(credentials),
    }
    for value in found.get("Environment", []):
        for pair in shlex.split(specifiers(value, credentials)):
            key, _, assigned = pair.partition("=")
            env[key] = assigned
    for value in found.get("EnvironmentFile", []):
        env.update(environment_file(etc[value.removeprefix("-")]))
    for value in found.get("UnsetEnvironment", []):
        for name in shlex.split(value):
            env.pop(name, None)

    (start,) = found["ExecStart"]
    words = shlex.split(specifiers(start, credentials))
    argv = [VARIABLE.sub(lambda m: env.get(m.group(1), ""), word) for word in words]
    argv[0] = argv[0].replace("/opt/strata/bin/", f"{bindir}/")
    return Service(argv, env, credentials)
