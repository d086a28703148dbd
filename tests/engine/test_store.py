"""The client store (engine/store.py): states round-trip bit for bit with a bounded cache, sums over every
client stream the same bits as a dict gives, a checkpoint writes only the states changed since the last one,
and a run restored from a mid-run checkpoint replays to the same bits, also a 10,000-client study killed mid-run."""

from __future__ import annotations

import pickle
import signal
from pathlib import Path

import numpy as np
import pytest

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.pool import InProcessPool
from fltune.engine.store import ClientStore, WithRound
from fltune.errors import FLTuneError
from fltune.methods._drift import divided, sum_over_clients
from fltune.methods.base import holders
from tests.conftest import needs_fmnist
from tests.engine.test_executor_exact import TINY, assert_same
from tests.tune.helpers import TINY_BASE, finished, start, tune_command, write_space
from tests.tune.test_full_disk import objectives
from tests.tune.test_resume import rounds_reported, run_until, wait_for_saved_checkpoint


def state(rng: np.random.Generator) -> dict:
    """A client state as methods keep them: a sub-state of named arrays (c_k), one array (FedPAC's summaries)."""
    return {"c": {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
                  "n": rng.integers(0, 9, 2)},
            "summaries": rng.standard_normal((2, 5))}


def test_states_round_trip_bit_for_bit_with_a_bounded_cache(tmp_path):
    rng = np.random.default_rng(0)
    states = {cid: state(rng) for cid in (0, 3, 7, 9)}
    states[5] = {}  # a client trained by a method that keeps nothing is still known
    store = ClientStore(12, tmp_path, cache=2)
    store.update(states)
    assert list(store) == [0, 3, 5, 7, 9] and len(store) == 5 and 4 not in store and store.get(4) is None
    for cid in states:
        assert_same(store[cid], states[cid], str(cid))
    assert len(store.cache) == 2
    assert store.holders("c") == holders(states, "c") == 4
    with pytest.raises(FLTuneError, match="client state 'c': client 1's arrays differ"):
        store.update({1: {"c": {"w": np.zeros(3, np.float32)}}})


def test_sums_over_every_client_stream_the_dicts_bits(tmp_path):
    """SCAFFOLD's c = mean of every c_k: from the store, and from the store with a round's states over it
    (what the server step reads), the very bits the plain dict gives."""
    rng = np.random.default_rng(1)
    stored = {cid: state(rng) for cid in range(0, 40, 3)}
    store = ClientStore(40, tmp_path)
    store.update(stored)
    rounds = {3: state(rng), 4: state(rng), 8: {}}
    merged = {**stored, **rounds}
    for mapping, plain in ((store, stored), (WithRound(store, rounds), merged)):
        mean, plain_mean = divided(sum_over_clients(mapping, "c"), 40), divided(sum_over_clients(plain, "c"), 40)
        assert_same(mean, plain_mean, type(mapping).__name__)
        assert holders(mapping, "c") == holders(plain, "c")
        assert list(mapping) == sorted(plain)


def test_a_checkpoint_writes_only_the_changed_states_and_restores_any_version(tmp_path):
    rng = np.random.default_rng(2)
    store = ClientStore(50, tmp_path / "run")
    store.update({cid: state(rng) for cid in range(50)})
    first = store.commit(1)
    at_first = {cid: store[cid] for cid in store}
    assert store.commit(1) == first  # nothing changed: nothing written
    store.update({4: state(rng), 17: state(rng)})
    second = store.commit(2)
    log = tmp_path / "run" / "log"
    with np.load(log / "000000001.npz") as full, np.load(log / "000000002.npz") as delta:
        assert delta["cids"].tolist() == [4, 17] and len(full["cids"]) == 50
        assert [len(delta[f"rows{i}"]) for i in range(2)] == [2, 2] and len(full["rows0"]) == 50

    elsewhere = ClientStore(50, tmp_path / "other")
    elsewhere.restore(pickle.loads(pickle.dumps(second)))  # as a checkpoint carries it
    assert np.array_equal(elsewhere[4]["c"]["w"], store[4]["c"]["w"])
    store.restore(first)  # the mid-run checkpoint: the later version is dropped
    assert_same({cid: store[cid] for cid in store}, at_first, "restored")
    assert sorted(p.name for p in log.iterdir()) == ["000000001.npz"]
    with pytest.raises(FLTuneError, match="client store: the checkpoint refers to 2 log files"):
        ClientStore(50, tmp_path / "third").restore({**second, "folder": str(tmp_path / "missing")})


@pytest.mark.slow
def test_a_run_restored_from_a_mid_run_checkpoint_replays_the_same_bits(ray_session, tmp_path):
    """SCAFFOLD (its c is a mean over every client's c_k, read from the store) with checkpoints after rounds 1
    and 2: restored from the earlier one into a new run folder, round 2 and 3 replay to the straight run's bits."""
    cfg = build_config(overrides=[*TINY, "method.name=scaffold", "federation.clients=6", "federation.rounds=3"])
    pool = InProcessPool(1)
    straight = build_federation(cfg, pool=pool, folder=tmp_path / "straight")
    straight.run()
    first = build_federation(cfg, pool=pool, folder=tmp_path / "first")
    first.step()
    saved = pickle.dumps(first.state_dict())
    first.step()
    first.state_dict()  # a later checkpoint, which the restore must not see
    resumed = build_federation(cfg, pool=pool, folder=tmp_path / "resumed")
    resumed.load_state_dict(pickle.loads(saved))
    resumed.run()
    runs = [(fed.global_state, fed.server_state, dict(fed.client_store),
             [{k: v for k, v in row.items() if not k.endswith("_s")} for row in fed.history])
            for fed in (straight, resumed)]
    assert_same(*runs, "scaffold resumed")
    assert Path(tmp_path / "first" / "clients" / "log").is_dir()


@needs_fmnist
@pytest.mark.slow
@pytest.mark.extended
def test_a_10000_client_scaffold_study_killed_mid_run_resumes_to_the_same_bits(tmp_path, mlflow_uri):
    """SCAFFOLD at 10,000 clients (one FMNIST sample each: the synthetic set has 6,000), the MLP, 10 a round,
    ``server_mean=running`` (its sum lives in the server state), a checkpoint every round: the study's driver
    killed (SIGKILL) once two rounds are reported and its saved state names a checkpoint, then resumed, ends with
    the numbers of a study never stopped. A round here takes a fraction of a second: 40 rounds keep the study
    running for seconds after the kill is due, so there is something left to resume."""
    rounds = 40
    base = {**TINY_BASE, "data": {"dataset": "fmnist", "subsample": 0.17},
            "partition": {"kind": "iid", "eval_fraction": 0.0},
            "federation": {"clients": 10000, "fraction": 0.001, "rounds": rounds},
            "training": {"local_epochs": 1, "batch_size": 10}}
    space = write_space(tmp_path, method="scaffold", base=base, num_samples=1, max_concurrent=1,
                        params={"method.server_mean": {"type": "choice", "values": ["running"]}})
    cmd = tune_command(space, tmp_path)  # a checkpoint every round: the default
    first = start(cmd, tmp_path / "1.log")
    run_until(first, tmp_path / "study", more=2)
    wait_for_saved_checkpoint(tmp_path / "study")
    first.send_signal(signal.SIGKILL)  # the driver alone; its Ray processes share its fate
    first.wait(timeout=60)
    before = len(rounds_reported(tmp_path / "study"))
    assert before < rounds, "the study ended before the kill: nothing left to resume"
    second = start([*cmd, "--resume"], tmp_path / "2.log")
    assert finished(second, tmp_path / "2.log", timeout=400) == 0, (tmp_path / "2.log").read_text()
    reference = start(tune_command(space, tmp_path / "ref", "--set", "tracking.enabled=false"), tmp_path / "3.log")
    assert finished(reference, tmp_path / "3.log", timeout=400) == 0, (tmp_path / "3.log").read_text()
    resumed_rounds = rounds_reported(tmp_path / "study")[before:]  # from the checkpoint on, not from round 1
    assert 1 < resumed_rounds[0] <= before + 1 and resumed_rounds == list(range(resumed_rounds[0], rounds + 1))
    resumed, straight = objectives(tmp_path / "study"), objectives(tmp_path / "ref" / "study")
    assert [row[0] for row in resumed.values()] == [rounds] and resumed == straight
