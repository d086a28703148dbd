"""Weights and the server payload on the training device (engine/transfer.py): each distinct array copied
once, with its own bits, and only what a client has not loaded yet."""

import pickle

import numpy as np
import torch

from fltune.engine.builders import build_model_for
from fltune.engine.transfer import RoundInput, device_states, load_changed, load_state, state_on_device
from tests.engine.test_local import _final_round_setup


def test_load_changed_copies_only_tensors_it_has_not_loaded():
    """Clients share the global weights' device twins: the second client's load copies its own head alone.
    A weight written since (which the evaluation loop never does) is left as it is when its tensor is the
    one loaded: the cache is only valid while nothing else writes the model."""
    cfg, data, _, inputs = _final_round_setup("fedper")
    model, reference = build_model_for(cfg, data), build_model_for(cfg, data)
    shared = inputs.global_state
    head = {k: v + np.float32(1) for k, v in shared.items() if k.startswith("head.")}
    stray = next(k for k, _ in model.named_parameters() if not k.startswith("head."))
    twins = state_on_device(shared, torch.device("cpu"))
    first, second = device_states([shared, {**shared, **head}], torch.device("cpu"), shared, twins)
    loaded: dict = {}
    load_changed(model, first, loaded)
    with torch.no_grad():
        model.get_parameter(stray).add_(1.0)
    load_changed(model, second, loaded)
    load_state(reference, {**shared, **head})
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(got, want) == (name != stray), name


def test_device_states_move_each_distinct_array_once_and_keep_its_bits():
    """The global weights' entries are their twins themselves; every other distinct array (a personal part
    two clients share, as a never-sampled client shares the global one) is moved once, all of one dtype in
    one buffer; the values are the arrays' own, dtype and shape included."""
    shared = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.float32([0.5]),
              "n": np.array(3, dtype=np.int64)}
    head = {"b": np.float32([np.pi])}
    twins = state_on_device(shared, torch.device("cpu"))
    assert {twins[k].untyped_storage().data_ptr() for k in ("w", "b")} == {twins["w"].untyped_storage().data_ptr()}
    states = [shared, {**shared, **head}, {**shared, **head}, {**shared, "w": shared["w"] * 2}]
    loads = device_states(states, torch.device("cpu"), shared, twins)
    assert all(loads[0][k] is twins[k] for k in shared) and loads[1]["w"] is twins["w"]
    assert loads[1]["b"] is loads[2]["b"] and loads[1]["b"] is not twins["b"]
    for state, load in zip(states, loads):
        assert list(load) == list(state)
        for k, v in state.items():
            assert load[k].dtype == torch.from_numpy(v).dtype and load[k].numpy().tobytes() == v.tobytes(), k


def test_a_rounds_server_payload_goes_to_the_device_once_for_every_client_a_process_trains():
    """``RoundInput.server_on``: each entry copied at its first read (an array: a tensor; a dict of arrays: a
    dict of tensors, one buffer per dtype), the same tensors for every later read and client, the arrays'
    own bits; Ray ships the round without the copies, and a presence check copies nothing."""
    server = {"r": np.float32([[1.5, -2.0]]), "c": {"w": np.arange(4, dtype=np.float32), "n": np.int64([7])},
              "count": 3}
    inputs = RoundInput(round=1, seed=0, lr=0.1, global_state={}, server=server)
    on_cpu = inputs.server_on(torch.device("cpu"))
    assert "c" in on_cpu and "missing" not in on_cpu and on_cpu.copied == {}
    r, c = on_cpu["r"], on_cpu["c"]
    assert inputs.server_on(torch.device("cpu")) is on_cpu and on_cpu["r"] is r and on_cpu["c"] is c
    assert r.numpy().tobytes() == server["r"].tobytes() and r.shape == (1, 2)
    assert {k: v.numpy().tobytes() for k, v in c.items()} == {k: v.tobytes() for k, v in server["c"].items()}
    assert on_cpu.get("missing") is None and sorted(on_cpu) == ["c", "count", "r"]
    shipped = pickle.loads(pickle.dumps(inputs))
    assert shipped.copies == {} and shipped.round == inputs.round and list(shipped.server) == list(server)
    assert shipped.server_on(torch.device("cpu"))["r"] is not r
