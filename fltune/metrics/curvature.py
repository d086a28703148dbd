"""The scheduled curvature probe (``metrics.hessian``, docs/methods.md §4); at the end also the top-2 loss surface and
top-k spectrum as PNGs (FedAlign Fig. 1, MAN Fig. 4a). Hessian-vector products run on the workers' devices (a Tune
trial's own process has no GPU); this module imports no torch, so probe settings are checked before Ray starts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fltune.engine.probes import Probe, RoundView, RunView
from fltune.metrics.probe import register

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig


@register
class HessianProbe(Probe):
    """The ``metrics.hessian`` schedule: every ``every`` rounds and/or at the end, on non-diverged rounds."""

    name = "hessian"
    order = 40
    clock = "hessian_s"
    in_wall = False  # a diagnostic: the run's wall_s is what the run costs without it
    metrics = {
        "hessian_lambda_max": "largest Hessian eigenvalue of the global model (FedAlign Table 1, MAN Table 2)",
        "hessian_trace": "Hessian trace of the global model (Hutchinson estimate)",
        "hessian_trace_se": "standard error of that trace estimate (its stop rule: SE/|mean| < trace_tol)",
        "hessian_hn": "H_N over the round's first k clients' local models (FedAlign Eq. 3)",
        "hessian_hd": "H_D over the same models (FedAlign Eq. 4)",
    }

    def __init__(self, run: RunView) -> None:
        self.keeps_local_models = run.cfg.metrics.hessian.clients > 0

    @classmethod
    def enabled(cls, cfg: ExperimentConfig) -> bool:
        return bool(cfg.metrics.hessian.every or cfg.metrics.hessian.at_end)

    @classmethod
    def unmet(cls, metric: str, cfg: ExperimentConfig) -> str | None:
        if not cls.enabled(cfg):
            return "needs a Hessian probe: metrics.hessian.every > 0 or metrics.hessian.at_end=true"
        if metric in ("hessian_hn", "hessian_hd") and cfg.metrics.hessian.clients == 0:
            return "needs metrics.hessian.clients ≥ 2 (local models compared)"
        return None

    def due(self, view: RoundView) -> bool:
        hcfg, last = view.run.cfg.metrics.hessian, view.round == view.run.cfg.federation.rounds
        return view.running and (bool(hcfg.every and view.round % hcfg.every == 0) or (hcfg.at_end and last))

    def measure(self, view: RoundView) -> dict[str, float]:
        """Hessian metrics of the global model and H_N/H_D over the round's first k clients, one
        ``CurvatureTask`` each on the workers."""
        from fltune.metrics._hessian import (
            CurvatureTask, client_traces, cross_client_consistency, global_curvature, global_landscape, plot_spectrum,
        )

        run, hcfg = view.run, view.run.cfg.metrics.hessian
        compared = sorted(view.local_models)[: hcfg.clients]
        landscape = view.round == run.cfg.federation.rounds and hcfg.landscape
        tasks: list[CurvatureTask] = [
            CurvatureTask(global_curvature, view.global_state),
            *(CurvatureTask(client_traces, run.latest[cid], cid) for cid in compared),
            *([CurvatureTask(global_landscape, view.global_state)] if landscape else []),
        ]
        results = run.compute(tasks)
        out = results[0]
        if compared:
            out.update(cross_client_consistency(results[1:1 + len(compared)]))
        if landscape:  # the loss along the top-2 eigenvectors and the eigenvalue spectrum, as PNG files
            eigen, title = [out[f"hessian_lambda_{i + 1}"] for i in range(hcfg.top_k)], run.cfg.method.name
            folder = Path(tempfile.mkdtemp(prefix="fltune-figures-"))
            spectrum = plot_spectrum(eigen, folder / "hessian_spectrum.png", f"top-{len(eigen)} eigenvalues · {title}")
            run.artifacts.extend([results[-1].png(folder / "loss_landscape.png", title), spectrum])
        return out

    def summary(self, run: RunView) -> dict[str, Any]:
        """The last measurement's figures, all from that one round (its ``hessian_s`` too)."""
        rows = [row for row in run.history if "hessian_lambda_max" in row]
        return {k: v for k, v in rows[-1].items() if k.startswith("hessian_")} if rows else {}
