"""The supervisor's side of worker log rotation (fairsched/log_files.py): every second, each log
in `<state_dir>/logs` past `[supervisor] log_max_bytes` is copied to its first backup and
emptied, in a thread, so that copying 50 MB never holds up the loop. Python workers rotate
their own logs as they write; this catches the rest (`command` workers, templates, the
watchdog, what C code writes straight to a worker's standard streams).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

from fairsched.errors import path_name
from fairsched.log_files import copy_and_truncate

log = logging.getLogger("fairsched.supervisor")

CHECK_EVERY = 1.0  # seconds between looks at the logs' sizes


class LogRotation:
    def __init__(self, log_dir: Path, max_bytes: int, backups: int):
        self.log_dir = log_dir
        self.max_bytes = max_bytes
        self.backups = backups
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._copying: asyncio.Future | None = None
        self._failed: set[str] = set()  # logs said to be impossible to rotate (said once each)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.max_bytes > 0:
            self._loop = loop
            self._timer = loop.call_later(CHECK_EVERY, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        if self._copying is None or self._copying.done():
            due = self.too_large()
            if due:
                self._copying = self._loop.run_in_executor(None, self._rotate, due)
        self._timer = self._loop.call_later(CHECK_EVERY, self._check)

    def too_large(self) -> list[Path]:
        """The logs (regular files, not links) past the size."""
        try:
            entries = list(os.scandir(self.log_dir))
        except OSError:  # gone: the next start makes it again
            return []
        due = []
        for entry in entries:
            if not entry.name.endswith(".log"):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size > self.max_bytes:
                due.append(Path(entry.path))
        return due

    def _rotate(self, paths: list[Path]) -> None:
        """In a thread of the loop's executor."""
        for path in paths:
            try:
                if copy_and_truncate(path, self.max_bytes, self.backups):
                    log.debug("%s passed log_max_bytes: copied to %s.1 and emptied",
                              path_name(path), path.name)
            except OSError as exc:
                if path.name not in self._failed:
                    self._failed.add(path.name)
                    log.warning("cannot rotate %s: %s (said once)", path_name(path),
                                exc.strerror or exc)
