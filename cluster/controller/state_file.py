"""The controller's state on disk: DIR/controller-state.json, guarded by
DIR/lock while a controller process runs.

Write (every change of the persisted state, before any answer leaves):
the JSON form (ha/controller/persist.py) to DIR/controller-state.json.tmp,
fsync it, rename it over DIR/controller-state.json, fsync DIR. A crash at
any point leaves the old file or the new one, never a mix; a `.tmp` left by
a crash before its rename is removed at the next start (it was never the
state: nobody was told of it).

Read at start: no file is a new controller (no brokers, epochs 0); a file
that does not decode, or decodes to a state breaking an invariant, is
refused (ControllerStateFileError naming the file and the fix), never
replaced by an empty state: a controller that forgot its master epoch would
hand out epochs the brokers have already seen.

The lock is the store's (store/seams/lock.py: an flock on DIR/lock with the
holder's pid), so a second controller on the same directory is refused
while the first runs, and a killed one's lock goes with its process.
"""

from __future__ import annotations

import os

from ha.controller.persist import ControllerStateError, from_json, to_json
from ha.controller.state import ControllerState
from store.seams.disk import Disk, DiskLock, RealDisk
from store.seams.lock import StoreLockedError

STATE_FILE = "controller-state.json"
TMP_SUFFIX = ".tmp"
LOCK_FILE = "lock"
# A state file is a few hundred bytes per broker; anything far larger is not one.
MAX_STATE_BYTES = 1 << 20


class ControllerStateFileError(RuntimeError):
    """The state directory cannot be used; the message names the file and the fix."""


class ControllerStateFile:
    """The state directory of one controller process, locked while open."""

    def __init__(self, state_dir: str, *, disk: Disk | None = None) -> None:
        self.disk = disk or RealDisk()
        self.dir = state_dir
        self.path = os.path.join(state_dir, STATE_FILE)
        self._lock: DiskLock | None = None

    def open(self) -> ControllerState:
        """Take the lock and read the state (a new one if there is no file)."""
        if self.disk.exists(self.dir) and not self.disk.isdir(self.dir):
            raise ControllerStateFileError(
                f"{self.dir} is not a directory; give --dir a directory for the "
                "controller's state")
        try:
            self.disk.makedirs(self.dir)
        except OSError as exc:
            raise ControllerStateFileError(
                f"cannot create the state directory {self.dir}: {exc.strerror}") from None
        lock_path = os.path.join(self.dir, LOCK_FILE)
        try:
            self._lock = self.disk.lock(lock_path)
        except StoreLockedError:
            raise ControllerStateFileError(
                f"another controller holds {lock_path} (its pid is in that file): stop it "
                "or give this one another --dir") from None
        try:
            return self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> ControllerState:
        tmp = self.path + TMP_SUFFIX
        if self.disk.exists(tmp):
            self.disk.unlink(tmp)  # a write a crash stopped before its rename
        if self.disk.islink(self.path) or (self.disk.exists(self.path)
                                           and not self.disk.isfile(self.path)):
            raise ControllerStateFileError(
                f"{self.path} is not a regular file: move it away and restore the "
                "controller's state file there")
        if not self.disk.exists(self.path):
            return ControllerState()
        try:
            raw = self.disk.read_file(self.path, MAX_STATE_BYTES + 1)
        except OSError as exc:
            raise ControllerStateFileError(
                f"cannot read controller state file {self.path}: {exc.strerror}; give "
                "this user read access to it") from None
        try:
            if len(raw) > MAX_STATE_BYTES:
                raise ControllerStateError(f"it is larger than {MAX_STATE_BYTES} bytes")
            if not raw:
                raise ControllerStateError("it is empty (truncated)")
            return from_json(raw.decode("utf-8"))
        except (ControllerStateError, UnicodeDecodeError) as exc:
            raise ControllerStateFileError(
                f"controller state file {self.path} cannot be read: {exc}. Restore it "
                "from a copy; removing it starts a controller that has forgotten every "
                "broker and epoch (brokers that saw a later master epoch are then "
                "refused), so do that only when the whole cluster starts anew") from None

    def save(self, state: ControllerState) -> None:
        """Make `state` the file's, durably before returning (module docstring)."""
        assert self._lock is not None, "save() before open()"
        data = to_json(state).encode("utf-8")
        if len(data) > MAX_STATE_BYTES:
            # Never write what the next start would refuse to read.
            raise OSError(f"the state would take {len(data)} bytes, over the "
                          f"{MAX_STATE_BYTES} a start reads")
        tmp = self.path + TMP_SUFFIX
        if self.disk.exists(tmp):
            self.disk.unlink(tmp)
        f = self.disk.create(tmp)
        try:
            pos = 0
            while pos < len(data):
                n = f.pwrite(memoryview(data)[pos:], pos)
                if n <= 0:
                    raise OSError(f"short write of {tmp} at byte {pos}")
                pos += n
            f.fsync()
        finally:
            f.close()
        self.disk.rename(tmp, self.path)
        self.disk.fsync_dir(self.dir)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
