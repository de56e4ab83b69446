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


# A figure described as data: what E2B's code interpreter returns as a
# result's "chart", so that a program can read a plot without looking at
# its picture. An axes is a line, scatter, bar, pie or box-and-whisker
# chart when everything drawn on it is of that kind, "unknown" otherwise;
# a figure of several axes is a "superchart" of them. Read after the
# figure was drawn: tick labels exist only then.

import math
import re

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")
# Beyond this many points a figure is not described (its PNG still is).
MAX_POINTS = 200_000


def describe(fig):
    """Returns the figure's chart as a JSON-ready dict, or None."""
    axes = fig.get_axes()
    if not axes:
        return None
    if len(axes) > 1:
        # Its title is the figure's suptitle, "" when it has none (E2B's
        # is figure.get_suptitle(), which matplotlib 3.8 added).
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
        return {"type": "superchart", "title": title, "elements": [_describe_axes(ax) for ax in axes]}
    return _describe_axes(axes[0])


def _describe_axes(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    children = getattr(ax, "_children", None)
    if children is None:
        children = list(ax.lines) + list(ax.collections) + list(ax.patches)
    objs = [o for o in children if not isinstance(o, Text)]
    if all(isinstance(o, Line2D) for o in objs):
        return _line_chart(ax)
    if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return _box_chart(ax)
    objs = [o for o in objs if not (isinstance(o, Line2D) and _is_rule(o))]
    if all(isinstance(o, PathCollection) for o in objs):
        return _scatter_chart(ax)
    if all(isinstance(o, Wedge) for o in objs):
        return _pie_chart(ax)
    if all(isinstance(o, Rectangle) for o in objs):
        return _bar_chart(ax)
    return dict(_base(ax, "unknown"))


def _is_rule(line):
    """A horizontal or vertical rule across the axes (axhline, axvline)."""
    xs, ys = line.get_xdata(), line.get_ydata()
    return len(xs) == 2 and str(line.get_label()).startswith("_") and (xs[0] == xs[1] or ys[0] == ys[1]) and \
        line.get_transform() is not line.axes.transData


def _base(ax, kind):
    return {"type": kind, "title": ax.get_title() or None, "elements": []}


def _planar(ax, kind):
    d = _base(ax, kind)
    for axis in ("x", "y"):
        label = getattr(ax, "get_%slabel" % axis)() or None
        unit = None
        if label:
            m = _UNIT.search(label)
            if m:
                unit = m.group(1) or m.group(2)
        d[axis + "_label"], d[axis + "_unit"] = label, unit
    return d


def _swap_axes(d):
    for a, b in (("x_label", "y_label"), ("x_unit", "y_unit")):
        d[a], d[b] = d[b], d[a]


def _converter_kind(axis):
    conv = getattr(axis, "converter", None)
    mod = type(conv).__module__ if conv is not None else ""
    if mod == "matplotlib.dates":
        return "datetime"
    if mod == "matplotlib.category":
        return "categorical"
    return None


def _number(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f) or math.isinf(f):
        return None  # JSON has neither
    return f


def _value(v, kind):
    """A data value as JSON: a date as ISO 8601, a category as its text."""
    import datetime

    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    name = type(v).__name__
    if name == "datetime64":
        return str(v.astype("datetime64[s]"))
    if name == "Timestamp":
        return v.isoformat()
    if isinstance(v, str):
        return v
    if kind == "datetime":
        from matplotlib.dates import num2date

        try:
            return num2date(float(v)).isoformat()
        except Exception:
            return _number(v)
    return _number(v)


def _point_chart(ax, kind):
    d = _planar(ax, kind)
    for axis in ("x", "y"):
        a = getattr(ax, axis + "axis")
        conv = _converter_kind(a)
        ticks = getattr(ax, "get_%sticks" % axis)()
        d[axis + "_ticks"] = [_value(t, "datetime" if conv == "datetime" else None) for t in ticks]
        d[axis + "_tick_labels"] = [t.get_text() for t in getattr(ax, "get_%sticklabels" % axis)()]
        scale = getattr(ax, "get_%sscale" % axis)()
        d[axis + "_scale"] = conv if conv and scale == "linear" else scale
    return d


def _line_chart(ax):
    d = _point_chart(ax, "line")
    xk, yk = _converter_kind(ax.xaxis), _converter_kind(ax.yaxis)
    total = 0
    for line in ax.get_lines():
        if _is_rule(line):
            continue
        label = str(line.get_label())
        if label.startswith("_child"):
            label = "Line " + label[6:]
        xs, ys = line.get_xdata(), line.get_ydata()
        total += len(xs)
        if total > MAX_POINTS:
            return None
        d["elements"].append({"label": label, "points": [[_value(x, xk), _value(y, yk)] for x, y in zip(xs, ys)]})
    return d


def _scatter_chart(ax):
    d = _point_chart(ax, "scatter")
    xk, yk = _converter_kind(ax.xaxis), _converter_kind(ax.yaxis)
    total = 0
    for c in ax.collections:
        offsets = c.get_offsets()
        total += len(offsets)
        if total > MAX_POINTS:
            return None
        d["elements"].append({"label": str(c.get_label()),
                              "points": [[_value(x, xk), _value(y, yk)] for x, y in offsets]})
    return d


def _tick_names(ax, axis):
    ticks = getattr(ax, "get_%sticks" % axis)()
    labels = [t.get_text() for t in getattr(ax, "get_%sticklabels" % axis)()]
    return {round(float(t), 6): l for t, l in zip(ticks, labels)}


def _bar_chart(ax):
    d = _planar(ax, "bar")
    for container in ax.containers:
        group = str(container.get_label())
        if group.startswith("_container"):
            group = "Group " + group[10:]
        rects = list(container)
        heights = [r.get_height() for r in rects]
        # A BarContainer knows its orientation (matplotlib 3.4 on); else
        # bars of one height are taken to lie flat, as E2B does.
        orientation = getattr(container, "orientation", None)
        if orientation is None:
            horizontal = len(rects) > 1 and all(h == heights[0] for h in heights)
        else:
            horizontal = orientation == "horizontal"
        if horizontal:
            names = _tick_names(ax, "y")
            centers = [r.get_y() + r.get_height() / 2 for r in rects]
            values = [r.get_width() for r in rects]
        else:
            names = _tick_names(ax, "x")
            centers = [r.get_x() + r.get_width() / 2 for r in rects]
            values = heights
        for c, v in zip(centers, values):
            label = names.get(round(float(c), 6))
            if label is None:
                label = "%g" % c
            d["elements"].append({"label": label, "group": group, "value": _number(v)})
    if d["elements"] and horizontal:
        _swap_axes(d)
    return d


def _pie_chart(ax):
    d = _base(ax, "pie")
    for w in ax.patches:
        d["elements"].append({"label": str(w.get_label()), "angle": round(abs(w.theta2 - w.theta1), 4),
                              "radius": _number(w.r)})
    return d


def _box_chart(ax):
    d = _planar(ax, "box_and_whisker")
    lines = [(list(map(float, l.get_xdata())), list(map(float, l.get_ydata())), l) for l in ax.lines]
    vertical = _boxes_vertical(ax, lines)
    names = _tick_names(ax, "x" if vertical else "y")
    for patch in ax.patches:
        v = patch.get_path().vertices
        xs0, ys0 = [float(p[0]) for p in v], [float(p[1]) for p in v]
        if not vertical:
            xs0, ys0 = ys0, xs0
        lo, hi, q1, q3 = min(xs0), max(xs0), min(ys0), max(ys0)
        center = (lo + hi) / 2
        box = {"label": names.get(round(center, 6), "%g" % center), "min": q1, "first_quartile": q1,
               "median": (q1 + q3) / 2, "third_quartile": q3, "max": q3, "outliers": []}
        for xs, ys, line in lines:
            if not vertical:
                xs, ys = ys, xs
            if not xs or not all(lo - 1e-9 <= x <= hi + 1e-9 for x in xs):
                continue
            if str(line.get_linestyle()) in ("None", "none", "", " "):
                box["outliers"].extend(ys)  # fliers: markers only
            elif len(xs) == 2 and xs[0] == xs[1] and ys[0] != ys[1]:  # a whisker
                a, b = sorted(ys)
                if b <= q1 + 1e-9:
                    box["min"] = a
                elif a >= q3 - 1e-9:
                    box["max"] = b
            elif len(xs) == 2 and ys[0] == ys[1] and abs(abs(xs[1] - xs[0]) - (hi - lo)) < 1e-9 and q1 <= ys[0] <= q3:
                box["median"] = ys[0]
        box["outliers"] = sorted(set(box["outliers"]))
        d["elements"].append(box)
    if not vertical:
        _swap_axes(d)
    return d


def _boxes_vertical(ax, lines):
    """Whether the boxes stand upright: a whisker (a line from a box's
    edge outwards, at its middle) is vertical then."""
    if not ax.patches:
        return True
    v = ax.patches[0].get_path().vertices
    x0, x1 = float(min(v[:, 0])), float(max(v[:, 0]))
    y0, y1 = float(min(v[:, 1])), float(max(v[:, 1]))
    for xs, ys, _ in lines:
        if len(xs) != 2:
            continue
        if xs[0] == xs[1] and ys[0] != ys[1] and abs(xs[0] - (x0 + x1) / 2) < 1e-9 and \
                (min(ys) >= y1 - 1e-9 or max(ys) <= y0 + 1e-9):
            return True
        if ys[0] == ys[1] and xs[0] != xs[1] and abs(ys[0] - (y0 + y1) / 2) < 1e-9 and \
                (min(xs) >= x1 - 1e-9 or max(xs) <= x0 + 1e-9):
            return False
    return True
