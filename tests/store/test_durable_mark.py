"""The durable mark's record of unsynced files (store/log/durable_mark.py,
"Unsynced files"): its format (decodes whole, or not at all), the order
that makes a kill inside its write harmless, and a power cut that puts the
files back without ever writing through a link. The end-to-end use (the
epoch file under `--emulate rmq-epoch-in-place`) is in
tests/ha/test_epoch_file.py and tests/chaos/test_known_bugs.py."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from store.log.durable_mark import (
    SIZE,
    DurableMark,
    decode_files,
    encode_files,
    power_cut,
    read_unsynced_files,
)
from store.seams.disk import RealDisk

FILES: dict[str, bytes | None] = {"epochFileCheckpoint": b"1\n3\n1-0\n",
                                  "epochFileCheckpoint.bak": None, "empty": b""}


def test_the_record_round_trips_and_no_strict_prefix_decodes() -> None:
    record = encode_files(FILES)
    assert decode_files(record) == FILES
    for n in range(len(record)):
        assert decode_files(record[:n]) is None
    assert decode_files(record + b"\0") is None


NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
                min_size=1, max_size=20).filter(
    lambda n: n not in (".", "..", "durable-mark") and len(n.encode()) < 256)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(NAMES, st.none() | st.binary(max_size=40), max_size=4),
       st.integers(0, 400), st.integers(1, 255))
def test_fuzzed_a_record_decodes_whole_or_not_at_all(files: dict[str, bytes | None],
                                                     pos: int, flip: int) -> None:
    record = bytearray(encode_files(files))
    assert decode_files(bytes(record)) == files
    record[pos % len(record)] ^= flip
    got = decode_files(bytes(record))
    assert got is None or encode_files(got) == bytes(record)


def _store_root(tmp_path: Path) -> tuple[str, DurableMark]:
    """A store root as an open power-model store leaves it: `abort` and a mark."""
    root = tmp_path / "s"
    root.mkdir()
    (root / "abort").write_bytes(b"")
    return str(root), DurableMark.open(RealDisk(), str(root), 0)


def test_a_record_without_its_length_restores_nothing(tmp_path: Path) -> None:
    """Killed inside `unsynced_files`, after the record's bytes and before
    the length that makes it count: no unsynced write was made yet, and the
    cut leaves the files as they are."""
    root, mark = _store_root(tmp_path)
    (Path(root) / "a").write_bytes(b"kept")
    fd = os.open(os.path.join(root, "durable-mark"), os.O_WRONLY)
    os.pwrite(fd, encode_files({"a": None}), SIZE)
    os.close(fd)
    assert read_unsynced_files(root) is None
    cut = power_cut(root)
    assert cut.applied and cut.files_removed == cut.files_restored == ()
    assert (Path(root) / "a").read_bytes() == b"kept"
    mark.close()


def test_the_cut_puts_files_back_and_never_writes_through_a_link(tmp_path: Path) -> None:
    root, mark = _store_root(tmp_path)
    store = Path(root)
    outside = tmp_path / "outside"
    outside.write_bytes(b"not the store's")
    (store / "a").write_bytes(b"old a")
    mark.unsynced_files({os.path.join(root, "a"): b"old a", os.path.join(root, "b"): None,
                         os.path.join(root, "c"): b"old c", os.path.join(root, "d"): None})
    (store / "a").write_bytes(b"new a, never fsynced")
    (store / "b").write_bytes(b"made by an unsynced write")
    (store / "c").symlink_to(outside)  # made a link since: left alone
    cut = power_cut(root)
    assert (cut.files_restored, cut.files_removed) == (("a",), ("b",))
    assert (store / "a").read_bytes() == b"old a"
    assert not (store / "b").exists() and not (store / "d").exists()
    assert (store / "c").is_symlink() and outside.read_bytes() == b"not the store's"
    mark.close()
