"""The worker plan (``plan_workers``) and the driver's share of a round (``WorkerPlan.in_driver``): when it is
on by default, what refuses it, and that a share trained in the driver's process gives an actor's bits —
training, evaluation and the probes' computations (``dispatch.deal``) alike — handed back as copies
outside Ray's object store, and an ``InProcessPool`` alone gives one actor's bits; and that FLOP counting
(round 1's meters, the model's count) loads no part of torch's compiler stack in any worker, so the
driver's share takes part in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.dispatch import deal
from fltune.engine.pool import InProcessPool, WorkerPlan, WorkerPool, plan_workers
from fltune.errors import FLTuneError
from fltune.metrics.cost import model_flops
from tests.engine.test_federation import BASE, run, same_weights
from tests.engine.test_federation_probes import HESSIAN
from tests.engine.test_worker import spec_of

CPUS = {"CPU": 4.0}


@pytest.mark.parametrize(("sets", "cluster", "own_ray", "in_driver"), [
    ([], CPUS, True, True),  # `run` on a Ray it started: the driver's CPU is one of the workers'
    ([], CPUS, False, False),  # joined a cluster, or a Tune trial: the driver's process reserves no CPU
    (["resources.workers=1"], CPUS, True, False),  # one worker: it keeps its process, the driver only waits
    ([], {"CPU": 4.0, "GPU": 1.0}, True, False),  # the workers train on GPUs, the driver has none reserved
    (["resources.driver_worker=false"], CPUS, True, False),
    (["resources.driver_worker=true"], CPUS, False, True),
])
def test_driver_share_is_on_for_a_run_on_its_own_cpu_ray(sets, cluster, own_ray, in_driver):
    plan = plan_workers(build_config(overrides=["federation.fraction=0.1", *sets]), cluster, own_ray)
    assert plan.in_driver is in_driver
    assert len(plan.bundles()) == plan.actors == plan.workers - in_driver


def test_driver_share_with_gpu_workers_is_refused_in_one_line():
    cfg = build_config(overrides=["federation.fraction=0.1", "resources.driver_worker=true"])
    with pytest.raises(FLTuneError, match=r"^resources\.driver_worker: .*allowed: false or null") as err:
        plan_workers(cfg, {"CPU": 4.0, "GPU": 1.0}, own_ray=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("cluster", "allowed"), [
    ({"CPU": 4.0, "GPU": 1.0}, "allowed: workers × gpus_per_worker ≤ 1"),
    (CPUS, "allowed: 0 or unset (this Ray has no GPU: the workers train on CPUs)"),
])
def test_more_gpus_than_the_cluster_has_are_refused_with_what_it_allows(cluster, allowed):
    cfg = build_config(overrides=["federation.fraction=0.1", "resources.workers=2", "resources.gpus_per_worker=1"])
    with pytest.raises(FLTuneError, match="resources.gpus_per_worker: 2 × 1 GPU need 2 GPUs") as err:
        plan_workers(cfg, cluster, own_ray=True)
    assert str(err.value).endswith(allowed) and "\n" not in str(err.value)


def test_driver_share_gives_the_actors_bits(ray_session):
    """2 workers — two actors, or one actor and this process — on a run with Hessian probes (computed on
    the workers) and per-round evaluation: the same figures and weights; the driver's thread count, which
    its share trains with 1 thread, is its own again afterwards."""
    threads = torch.get_num_threads()
    overrides = [*BASE, *HESSIAN, "resources.workers=2"]
    shared = run(build_federation(build_config(overrides=[*overrides, "resources.driver_worker=true"])))
    assert torch.get_num_threads() == threads
    actors = run(build_federation(build_config(overrides=[*overrides, "resources.driver_worker=false"])))
    assert shared.status == actors.status == "finished"
    figures = [sorted(k for k in row if "time" not in k and not k.endswith("_s")) for row in actors.history]
    assert any("hessian_lambda_max" in keys for keys in figures)
    assert [[row[k] for k in keys] for row, keys in zip(shared.history, figures)] == \
        [[row[k] for k in keys] for row, keys in zip(actors.history, figures)]
    assert same_weights(shared, actors)


def test_an_in_process_pool_gives_one_actors_run(pools):
    """The in-process pool on its own (width 1, no worker process): a run with Hessian probes, the cost
    meters and every evaluation protocol gives the bits of the same run on one actor, and leaves the
    driver's thread count as it was."""
    threads = torch.get_num_threads()
    cfg = build_config(overrides=[*BASE, *HESSIAN, "resources.workers=1"])
    alone = run(build_federation(cfg, pool=InProcessPool()))
    assert torch.get_num_threads() == threads
    actor = run(build_federation(cfg, pool=pools[1]))
    figures = [sorted(k for k in row if not k.endswith("_s")) for row in actor.history]
    assert any("hessian_lambda_max" in keys for keys in figures) and "cost_train_forward_mflops" in figures[0]
    assert [[row[k] for k in keys] for row, keys in zip(alone.history, figures)] == \
        [[row[k] for k in keys] for row, keys in zip(actor.history, figures)]
    assert same_weights(alone, actor) and alone.latest.keys() == actor.latest.keys()


def process_id(cfg: object, data: object, device: torch.device) -> int:
    """A probe task (``ProbeTask``): the process it ran in."""
    return os.getpid()


def big_result(cfg: object, data: object, device: torch.device) -> np.ndarray:
    """A probe task whose result is too large for Ray to inline in a reply (> 100 KiB)."""
    return np.ones(1 << 18)


def test_the_driver_shares_results_are_copies_outside_the_object_store(ray_session):
    """What the driver's share returns is a deep copy on the driver's heap (writable, owning its memory),
    not an object put in Ray's store, whose pages stay resident once used; an actor's result comes from
    the store, read-only."""
    cfg = build_config(overrides=BASE)
    from fltune.engine.builders import load_data

    pool = WorkerPool(WorkerPlan(workers=2, cpus=1.0, gpus=0.0, in_driver=True))
    try:
        own, actors = deal(pool, pool.bind(spec_of(cfg, load_data(cfg)))[0], [big_result] * 2)
        assert own.flags.writeable and own.flags.owndata
        assert not actors.flags.writeable
        assert np.array_equal(own, actors)
    finally:
        pool.shutdown()


def test_the_driver_share_takes_slot_0_of_every_call(ray_session):
    """The driver's share takes slot 0 of a call and the actor the next, in turn; with no actor at all the
    driver does everything."""
    data_cfg = build_config(overrides=BASE)
    from fltune.engine.builders import load_data

    data = load_data(data_cfg)
    pool = WorkerPool(WorkerPlan(workers=2, cpus=1.0, gpus=0.0, in_driver=True))
    alone = WorkerPool(WorkerPlan(workers=1, cpus=1.0, gpus=0.0, in_driver=True))
    try:
        assert (pool.width(), alone.width()) == (2, 1)
        shared = deal(pool, pool.bind(spec_of(data_cfg, data))[0], [process_id] * 3)
        assert shared[0] == shared[2] == os.getpid() != shared[1]
        assert deal(alone, alone.bind(spec_of(data_cfg, data))[0], [process_id]) == [os.getpid()]
    finally:
        pool.shutdown()


def compiler_stack(cfg: object, data: object, device: torch.device) -> tuple[bool, bool, bool]:
    """A probe task: whether its process holds torch's compiler stack, and Triton, and whether it sees a GPU."""
    return "torch._dynamo" in sys.modules, sys.modules.get("triton") is not None, torch.cuda.is_available()


def test_an_actor_counts_flops_without_the_compiler_stack_and_without_a_gpu_without_triton(ray_session):
    """An actor that has counted the model's FLOPs (``model_flops``, torch's FLOP counter) holds no
    ``torch._dynamo`` (~150 MiB a process keeps for its life), and one that sees no GPU, where Triton can run
    nothing, no Triton either (``worker.skip_triton``, ~75 MiB)."""
    cfg = build_config(overrides=BASE)
    from fltune.engine.builders import load_data

    pool = WorkerPool(WorkerPlan(workers=1, cpus=1.0, gpus=0.0))
    try:
        mflops, (dynamo, triton, gpu) = deal(pool, pool.bind(spec_of(cfg, load_data(cfg)))[0],
                                             [model_flops, compiler_stack])
        assert mflops > 0
        assert not dynamo and (gpu or not triton)
    finally:
        pool.shutdown()


@pytest.mark.extended
def test_a_run_with_a_driver_share_meters_there_without_loading_the_compiler_stack(tmp_path):
    """``cli.py run`` on its own 2-CPU Ray, one share in the driver, MLflow on, with round 1's FLOP meters
    and the model's FLOP count: the driver's share meters its part of round 1 (torch's FLOP counter is
    loaded there), yet the driver's process ends without ``torch._dynamo`` (~150 MiB kept for the run's
    life, issue 12's tree memory) and, seeing no GPU, without Triton (~76 MiB), and the cost figures are
    there. In a fresh interpreter, since this one may have imported them already."""
    sets = [*BASE, "resources.workers=2", "resources.driver_worker=true", "tracking.enabled=true",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    argv = ["run", *(a for item in sets for a in ("--set", item)), "--json-out", str(tmp_path / "summary.json")]
    code = (f"import sys; from fltune.cli import main; print(main({argv!r}), 'torch._dynamo' in sys.modules, "
            "'torch.utils.flop_counter' in sys.modules, sys.modules.get('triton') is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-4:] == ["0", "False", "True", str(torch.cuda.is_available())]
    assert json.loads((tmp_path / "summary.json").read_text())["cost_cum_forward_mflops"] > 0
