"""The exclusive lock on an output while a moespec process writes it, so a second process writing the same file is
refused in one line instead of racing the first (the last writer would win).

The lock is an flock(2) on `.NAME.lock` beside the output NAME, taken without waiting. The process that holds it
removes the file when it lets go; one left behind by a killed process is harmless (the kernel drops the lock with
the process, and the next writer takes and then removes it). Holds are counted per path within a process, so a job
that holds its outputs for its whole run may call writers that take the same lock again.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moespec import MoespecError

_held: dict[Path, list[int]] = {}  # lock file -> [its descriptor, holds in this process]
_guard = threading.Lock()


def lock_file(path: str | os.PathLike) -> Path:
    """The lock file of output `path`: `.NAME.lock` in the same folder."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


def _acquire(lock: Path, name: str) -> int:
    """An open descriptor of `lock` holding its flock. After the flock, the name must still be that file: a holder
    removes its lock file before letting go, and a descriptor of a removed file locks nothing."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise MoespecError(f"{name}: cannot open its lock file {lock} ({e.strerror})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise MoespecError(f"{name}: its lock file {lock} is not a regular file; remove it")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise MoespecError(f"{name}: another moespec process is writing it (lock {lock}); wait for it to "
                                   f"end or write elsewhere") from None
            raise
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed it meanwhile: lock the new file


@contextmanager
def locked(path: str | os.PathLike, name: str) -> Iterator[None]:
    """Hold the exclusive lock on output `path` (its folder must exist); `name` is how refusals name it (the flag
    and the path). Refused in one line while another process holds it."""
    path = Path(path)
    lock = lock_file(path.parent.resolve() / path.name)
    with _guard:
        if lock in _held:
            _held[lock][1] += 1
        else:
            _held[lock] = [_acquire(lock, name), 1]
    try:
        yield
    finally:
        with _guard:
            _held[lock][1] -= 1
            if not _held[lock][1]:
                fd = _held.pop(lock)[0]
                lock.unlink(missing_ok=True)  # before the flock goes: see _acquire
                os.close(fd)
