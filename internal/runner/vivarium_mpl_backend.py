"""Matplotlib backend for Vivarium sandboxes: Agg rendering, and show()
hands every open figure to the runner as a PNG result."""

import sys

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args, **kwargs):
    runtime = sys.modules.get("_vivarium_runtime")
    if runtime is not None:
        runtime.flush_figures()
