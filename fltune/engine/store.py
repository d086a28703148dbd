"""The client store: every client's state (SCAFFOLD's c_k, FedDyn's h_k, Ditto's personal model, …) on disk, with a
small cache in memory, and checkpoints that write only what changed. Why on disk: a state is model-sized, so a dict of
them grows with the clients in total, while a round touches only its sampled clients'. Each state key (``c``,
``personal``, …) is one ``.npy`` file of ``clients`` rows of its arrays' bytes (the key's layout, fixed at its first
write), read and written with ``os.pread``/``os.pwrite``, never mapped: ``np.memmap`` keeps every page read resident,
and a sum over all clients (SCAFFOLD's c) reads them all. ``.npy``/``.npz`` need no new dependency and hold no pickles.

Checkpoints (``commit``): the rows written since the last commit go to one ``.npz`` of the store's log named by version
(the round); a checkpoint holds the version and folder, not the states. ``restore`` replays the log up to a version
exactly and drops later files. Writes are all or nothing (a temporary file renamed)."""

from __future__ import annotations

import heapq
import json
import os
import shutil
import tempfile
import weakref
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fltune.errors import FLTuneError

Layout = list[tuple[str, str, tuple[int, ...]]]
"""A state key's arrays: (name, dtype, shape) in order; name "" for a key that holds one array."""

LIVE, LOG = "live", "log"
READ_BYTES = 16 * 2**20
"""Bytes of rows read at once when streaming one key over every client (``held``)."""


def layout_of(value: Any) -> Layout:
    """The layout of one state value: an array, or a dict of arrays (a sub-state)."""
    if isinstance(value, np.ndarray):
        return [("", value.dtype.str, value.shape)]
    if isinstance(value, dict) and all(isinstance(v, np.ndarray) for v in value.values()):
        return [(name, v.dtype.str, v.shape) for name, v in value.items()]
    raise FLTuneError(f"client state: a value must be a numpy array or a dict of them, not {type(value).__name__}")


def row_bytes(layout: Layout) -> int:
    return sum(np.dtype(dtype).itemsize * int(np.prod(shape)) for _, dtype, shape in layout)


def encode(value: Any) -> bytes:
    arrays = [value] if isinstance(value, np.ndarray) else list(value.values())
    return b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


def decode(row: bytes | bytearray | memoryview, layout: Layout) -> Any:
    """A value back from its row: arrays viewing one writable buffer of their own."""
    buffer = bytearray(row)
    out, start = {}, 0
    for name, dtype, shape in layout:
        count = int(np.prod(shape))
        out[name] = np.frombuffer(buffer, np.dtype(dtype), count, start).reshape(shape)
        start += count * np.dtype(dtype).itemsize
    return out[""] if layout and layout[0][0] == "" else out


class ClientStore(Mapping[int, dict[str, Any]]):
    """Client id → state for ``clients`` clients, in ``folder`` (None: a temporary one, removed with the store);
    ``cache`` states stay decoded in memory (the round's clients, read then written back)."""

    def __init__(self, clients: int, folder: Path | None = None, cache: int = 16) -> None:
        self.clients, self.cache_size = clients, max(1, cache)
        self.files: dict[str, tuple[int, int, int]] = {}
        """key → (file descriptor, header bytes, row bytes) of its rows' file."""
        temporary = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="fltune-clients-")) if temporary else Path(folder)
        weakref.finalize(self, _release, self.files, self.folder if temporary else None)
        self.dirty: set[int] = set()
        """Clients written since the last ``commit``."""
        self.fresh = True
        """Not restored: the first ``commit`` starts the log anew (a folder reused by a new run)."""
        self._reset()

    # ---------------------------------------------------------------- reading
    def __getitem__(self, cid: int) -> dict[str, Any]:
        if cid not in self:
            raise KeyError(cid)
        if cid in self.cache:
            self.cache.move_to_end(cid)
            return self.cache[cid]
        state = {key: decode(self._read(key, cid, 1), layout)
                 for key, layout in self.layouts.items() if self.present[key][cid]}
        self._remember(cid, state)
        return state

    def __iter__(self) -> Iterator[int]:
        return iter(int(c) for c in np.flatnonzero(self.known))

    def __len__(self) -> int:
        return int(self.known.sum())

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, (int, np.integer)) and 0 <= cid < self.clients and bool(self.known[cid])

    def holders(self, key: str) -> int:
        """How many clients hold ``key``."""
        return int(self.present[key].sum()) if key in self.present else 0

    def holds(self, cid: int, key: str) -> bool:
        return key in self.present and bool(self.present[key][cid])

    def held(self, key: str) -> Iterator[tuple[int, Any]]:
        """(client, ``key`` value) for every holder in client-id order, read ``READ_BYTES`` at a time."""
        if key not in self.layouts:
            return
        layout, holders = self.layouts[key], np.flatnonzero(self.present[key])
        size = row_bytes(layout)
        span = max(1, READ_BYTES // max(1, size))
        for first in range(0, self.clients, span):
            block = holders[(holders >= first) & (holders < first + span)]
            if not len(block):
                continue
            rows = memoryview(self._read(key, int(block[0]), int(block[-1]) - int(block[0]) + 1))
            for cid in block:
                at = (int(cid) - int(block[0])) * size
                yield int(cid), decode(rows[at:at + size], layout)

    # ---------------------------------------------------------------- writing
    def update(self, states: Mapping[int, dict[str, Any]]) -> None:
        """Store each client's new state (the round's clients), replacing its old one whole."""
        for cid, state in states.items():
            for key, value in state.items():
                layout = layout_of(value)
                if key not in self.layouts:
                    self._add_key(key, layout)
                elif self.layouts[key] != layout:
                    raise FLTuneError(f"client state {key!r}: client {cid}'s arrays differ from the other clients'")
                self._write(key, cid, encode(value))
            for key, present in self.present.items():
                present[cid] = key in state
            self.known[cid] = True
            self.dirty.add(cid)
            self._remember(cid, state)

    def commit(self, version: int) -> dict[str, Any]:
        """Log the clients changed since the last commit as ``version``; returns the checkpoint's reference."""
        log = self.folder / LOG
        if self.fresh:
            shutil.rmtree(log, ignore_errors=True)
            self.fresh = False
        if self.dirty:
            log.mkdir(parents=True, exist_ok=True)
            partial = log / f".{version:09d}.npz"
            self._write_delta(partial, np.array(sorted(self.dirty), np.int64))
            partial.replace(log / f"{version:09d}.npz")
            self.dirty.clear()
        entries = len(list(log.glob("[0-9]*.npz"))) if log.is_dir() else 0
        return {"folder": str(self.folder), "version": version, "entries": entries, "clients": len(self)}

    def restore(self, ref: dict[str, Any]) -> None:
        """The store as ``commit`` left it at ``ref``'s version: log files up to it replayed (copied in first
        from another folder that still exists), later ones removed."""
        version, source = ref["version"], Path(ref["folder"]) / LOG
        log = self.folder / LOG
        log.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and source.resolve() != log.resolve():
            for entry in source.glob("[0-9]*.npz"):
                shutil.copyfile(entry, log / entry.name)
        self._reset()
        replayed = 0
        for entry in sorted(log.glob("[0-9]*.npz")):
            if int(entry.stem) > version:
                entry.unlink()
                continue
            self._replay(entry)
            replayed += 1
        if (replayed, len(self)) != (ref["entries"], ref["clients"]):
            raise FLTuneError(
                f"client store: the checkpoint refers to {ref['entries']} log files of {ref['clients']} clients' "
                f"states in {source}, but {log} holds {replayed} of {len(self)}; allowed: a checkpoint whose "
                "client-state folder this process can read (a Tune trial's storage path)")
        self.dirty.clear()
        self.fresh = False

    # ---------------------------------------------------------------- inside
    def _reset(self) -> None:
        """No client and no key: the live rows' files closed and removed (``files`` is the finalizer's)."""
        _release(self.files, None)
        shutil.rmtree(self.folder / LIVE, ignore_errors=True)
        (self.folder / LIVE).mkdir(parents=True)
        self.layouts: dict[str, Layout] = {}
        self.present: dict[str, np.ndarray] = {}
        self.known = np.zeros(self.clients, bool)
        self.cache: OrderedDict[int, dict[str, Any]] = OrderedDict()

    def _write_delta(self, path: Path, cids: np.ndarray) -> None:
        """An ``.npz`` of ``cids``' states: ids, layouts, and per key its holders (``has<i>``) and their rows
        (``rows<i>``), streamed a row at a time (any ``np.load`` reads it)."""
        with zipfile.ZipFile(path, "w") as archive:
            _put(archive, "cids", cids)
            _put(archive, "layouts", np.array(json.dumps(list(self.layouts.items()))))
            for i, key in enumerate(self.layouts):
                has = self.present[key][cids]
                _put(archive, f"has{i}", has)
                size = row_bytes(self.layouts[key])
                with archive.open(f"rows{i}.npy", "w", force_zip64=True) as out:
                    header = {"descr": "|u1", "fortran_order": False, "shape": (int(has.sum()), size)}
                    np.lib.format.write_array_header_2_0(out, header)
                    for cid in cids[has]:
                        out.write(self._read(key, int(cid), 1))

    def _replay(self, entry: Path) -> None:
        with zipfile.ZipFile(entry) as archive:
            cids = _get(archive, "cids")
            for i, (key, layout) in enumerate(json.loads(str(_get(archive, "layouts")))):
                layout = [(name, dtype, tuple(shape)) for name, dtype, shape in layout]
                if key not in self.layouts:
                    self._add_key(key, layout)
                has = _get(archive, f"has{i}")
                with archive.open(f"rows{i}.npy") as rows:
                    np.lib.format.read_magic(rows)
                    np.lib.format.read_array_header_2_0(rows)  # as _write_delta wrote it
                    for cid in cids[has]:
                        self._write(key, int(cid), rows.read(row_bytes(layout)))
                self.present[key][cids] = has
            self.known[cids] = True

    def _add_key(self, key: str, layout: Layout) -> None:
        """A new key's file: ``clients`` rows of its layout's bytes (sparse until written)."""
        self.layouts[key] = layout
        self.present[key] = np.zeros(self.clients, bool)
        path = self.folder / LIVE / f"{len(self.layouts) - 1}.npy"
        rows = np.lib.format.open_memmap(path, "w+", np.uint8, (self.clients, max(1, row_bytes(layout))))
        self.files[key] = (os.open(path, os.O_RDWR), int(rows.offset), max(1, row_bytes(layout)))
        del rows

    def _write(self, key: str, cid: int, row: bytes) -> None:
        fd, header, size = self.files[key]
        os.pwrite(fd, row, header + cid * size)

    def _read(self, key: str, first: int, count: int) -> bytes:
        """Rows ``first`` to ``first + count`` of ``key`` (bytes of the layout, one after another)."""
        fd, header, size = self.files[key]
        rows = os.pread(fd, size * count, header + first * size)
        return rows if size == row_bytes(self.layouts[key]) else b""  # a layout of empty arrays

    def _remember(self, cid: int, state: dict[str, Any]) -> None:
        self.cache[cid] = state
        self.cache.move_to_end(cid)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)


class WithRound(Mapping[int, dict[str, Any]]):
    """The round's ``states`` over ``store``, unwritten, for the server step (which may yet refuse the round)."""

    def __init__(self, store: ClientStore, states: Mapping[int, dict[str, Any]]) -> None:
        self.store, self.states = store, states

    def __getitem__(self, cid: int) -> dict[str, Any]:
        return self.states[cid] if cid in self.states else self.store[cid]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted({*self.store, *self.states}))

    def __len__(self) -> int:
        return len({*self.store, *self.states})

    def held(self, key: str) -> Iterator[tuple[int, Any]]:
        """``ClientStore.held`` with the round's states in their clients' places."""
        stored = ((cid, value) for cid, value in self.store.held(key) if cid not in self.states)
        own = sorted((cid, state[key]) for cid, state in self.states.items() if key in state)
        return heapq.merge(stored, own, key=lambda pair: pair[0])

    def holders(self, key: str) -> int:
        replaced = sum(self.store.holds(cid, key) for cid in self.states if cid in self.store)
        return self.store.holders(key) - replaced + sum(key in state for state in self.states.values())


def _release(files: dict[str, tuple[int, int, int]], temporary: Path | None) -> None:
    for fd, _, _ in files.values():
        os.close(fd)
    files.clear()
    if temporary is not None:
        shutil.rmtree(temporary, ignore_errors=True)


def _put(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    with archive.open(f"{name}.npy", "w") as out:
        np.lib.format.write_array(out, array, allow_pickle=False)


def _get(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    with archive.open(f"{name}.npy") as member:
        return np.lib.format.read_array(member, allow_pickle=False)
