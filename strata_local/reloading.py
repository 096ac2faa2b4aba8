"""A small YAML settings file that a long-running process re-reads when it changes (a
Kubernetes ConfigMap update, an operator's edit), keeping the last good contents when a
change does not parse; a file removed counts as absent (for a policy: nothing allowed).

Used for the CSI plugin's tenancy policy (``csi.tenancy``) and the spoke's scoped admin
tokens (``spoke.serve.admintokens``). The file is re-``stat``'ed on each use (inode, size
and mtime: a ConfigMap swaps a symlink, an editor renames over the file) and re-read only
when that changed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import yaml

log = logging.getLogger(__name__)

T = TypeVar("T")


def load_yaml(text: str, where: str, error: type[ValueError]) -> object:
    """``text`` parsed as YAML (``yaml.safe_load``).

    Raises:
        error: it is not YAML; one line naming ``where`` and the line and column.
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:  # one line: where, and what the parser says
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or " ".join(str(err).split())
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise error(f"{where} is not YAML{at}: {problem}") from None


class ReloadingFile(Generic[T]):
    """A file's parsed contents, re-parsed when the file changes.

    Args:
        path: The file; None stands for an absent one.
        parse: Turns the text (and the file's name, for messages) into the contents;
            raises a ``ValueError`` when the text is wrong.
        absent: The contents while there is no file.
        required: Whether a missing file at start is an error.

    Raises:
        ValueError: the file does not parse at start (or is missing while ``required``).
    """

    def __init__(
        self,
        path: Path | None,
        parse: Callable[[str, str], T],
        absent: T,
        required: bool = False,
    ) -> None:
        self.path = path
        self._parse = parse
        self._absent = absent
        self._lock = threading.Lock()
        self._stamp = self._stat()
        if self._stamp is None and required:
            raise ValueError(f"cannot read {path}: no such file")
        self._value = self._read() if self._stamp is not None else absent

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self) -> T:
        assert self.path is not None
        try:
            text = self.path.read_text()
        except OSError as err:
            raise ValueError(f"cannot read {self.path}: {err.strerror}") from None
        return self._parse(text, str(self.path))

    def current(self) -> T:
        """The contents now: re-read when the file changed; a change that does not parse
        keeps the last good contents (logged); a file that went away is ``absent``."""
        stamp = self._stat()
        if stamp == self._stamp:
            return self._value
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._value = self._read() if stamp is not None else self._absent
                except ValueError as err:
                    log.error("%s; the previous contents stay in use", err)
            return self._value
