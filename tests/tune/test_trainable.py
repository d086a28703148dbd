"""A trial's checkpoint file: written as a stream with protocol 5, read back bit for bit."""

from __future__ import annotations

import pickle
import tracemalloc
from pathlib import Path

import numpy as np

from fltune.tune.trainable import STATE_FILE, read_states, write_states


def seed_state(seed: int, clients: int = 4, size: int = 1 << 20) -> dict:
    """A federation state's shape: a global state, per-client personal arrays (one read-only, as arrays
    from Ray's object store are), a history."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(size).astype(np.float32)
    shared.flags.writeable = False
    personal = {cid: {"personal": {"w": rng.standard_normal(size).astype(np.float32)}} for cid in range(clients)}
    return {"round": 3, "global_state": {"w": shared}, "client_store": personal, "history": [{"acc": 0.5}]}


def test_states_round_trip_bit_for_bit_with_each_arrays_writability(tmp_path: Path) -> None:
    states = [seed_state(0), seed_state(1)]
    write_states(tmp_path, states)
    back = read_states(tmp_path)
    assert (tmp_path / STATE_FILE).read_bytes()[:2] == b"\x80\x05"  # pickle protocol 5
    for saved, loaded in zip(states, back, strict=True):
        assert loaded["round"] == saved["round"] and loaded["history"] == saved["history"]
        assert np.array_equal(loaded["global_state"]["w"], saved["global_state"]["w"])
        assert not loaded["global_state"]["w"].flags.writeable
        for cid, entry in saved["client_store"].items():
            restored = loaded["client_store"][cid]["personal"]["w"]
            assert restored.tobytes() == entry["personal"]["w"].tobytes() and restored.flags.writeable


def test_writing_a_checkpoint_holds_no_second_copy_of_the_state(tmp_path: Path) -> None:
    """A pickle built in memory first (protocol 4's ``dumps``) peaks at twice the state; streamed, the
    arrays go to the file from their own buffers."""
    states = [seed_state(0, clients=8)]  # 36 MiB of arrays
    size = sum(a.nbytes for a in [states[0]["global_state"]["w"]]
               + [e["personal"]["w"] for e in states[0]["client_store"].values()])
    tracemalloc.start()
    try:
        write_states(tmp_path, states)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 8, (peak, size)


def test_a_checkpoint_of_an_older_job_still_reads(tmp_path: Path) -> None:
    """Jobs checkpointed before protocol 5 (``pickle.dumps``' default, protocol 4) resume."""
    states = [seed_state(2, clients=1, size=16)]
    (tmp_path / STATE_FILE).write_bytes(pickle.dumps(states, protocol=4))
    back = read_states(tmp_path)
    assert np.array_equal(back[0]["client_store"][0]["personal"]["w"], states[0]["client_store"][0]["personal"]["w"])
