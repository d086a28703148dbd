"""Headless figures: matplotlib waits until a figure is drawn, and a drawn figure is a PNG on disk."""

import subprocess
import sys
from pathlib import Path

from fltune.metrics.figures import new_figure, save_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

DRAWING_MODULES = ["fltune.engine.worker", "fltune.metrics.curvature", "fltune.metrics._hessian",
                   "fltune.tune.results", "fltune.compare.report", "fltune.tracking.callback"]


def test_importing_the_modules_that_draw_does_not_import_matplotlib() -> None:
    """Client workers and Tune trials import these and never draw (each import of matplotlib cost ~25 MB)."""
    code = f"import sys\nfor m in {DRAWING_MODULES!r}: __import__(m)\nprint('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_figure_is_saved_as_png_in_a_new_folder(tmp_path: Path) -> None:
    fig = new_figure(figsize=(3, 2))
    fig.subplots().plot([0, 1], [1, 0])
    path = save_png(fig, tmp_path / "new" / "line.png", dpi=50)
    assert path == tmp_path / "new" / "line.png" and path.read_bytes().startswith(PNG_MAGIC)
