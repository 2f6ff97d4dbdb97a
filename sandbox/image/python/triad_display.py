"""Rich displays for Triad's Python kernels: charts, data and saved images.

register(shell) adds two IPython display formatters and one hook:

* application/vnd.triad.chart+json: a matplotlib Figure as structured data
  (line, scatter, bar, pie, box-and-whisker, several axes as a superchart,
  anything else as unknown), in the schema of E2B's code interpreter, so
  an agent reads the numbers instead of guessing them from the PNG. The PNG
  is still sent beside it.
* application/vnd.triad.data+json: a pandas DataFrame as {column: [values]}
  (timestamps as ISO 8601 strings).
* PIL's Image.save(path) also displays the image, as in E2B's sandbox.

Both formatters cost nothing until the cell has imported matplotlib or
pandas: they look in sys.modules first. A figure the extractor cannot read
gets an empty chart rather than an error (a display must never fail a
cell). Written for Triad (docs/DECISIONS.md, "Charts and data").
"""

import math
import re
import sys
from datetime import date, datetime
from decimal import Decimal, localcontext

CHART_MIME = "application/vnd.triad.chart+json"
DATA_MIME = "application/vnd.triad.data+json"


def register(shell):
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):
        format_type = Unicode(CHART_MIME)
        print_method = ObjectName("_repr_triad_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            if "matplotlib" not in sys.modules:
                return None
            from matplotlib.figure import Figure

            if not isinstance(obj, Figure):
                return None
            try:
                return _json_safe(figure_chart(obj))
            except Exception:
                return {}

    class DataFormatter(BaseFormatter):
        format_type = Unicode(DATA_MIME)
        print_method = ObjectName("_repr_triad_data_")
        _return_type = (dict,)

        def __call__(self, obj):
            pd = sys.modules.get("pandas")
            if pd is None or not isinstance(obj, pd.DataFrame):
                return None
            try:
                return _json_safe(frame_data(obj, pd))
            except Exception:
                return None

    formatters = shell.display_formatter.formatters
    formatters[CHART_MIME] = ChartFormatter(parent=shell.display_formatter)
    formatters[DATA_MIME] = DataFormatter(parent=shell.display_formatter)
    _hook_pil_save()


def frame_data(df, pd):
    """A DataFrame as {column: [values]}, timestamps as ISO strings."""
    out = {}
    for key, values in df.to_dict(orient="list").items():
        out[str(key)] = [v.isoformat() if isinstance(v, (pd.Timestamp, datetime, date)) else v for v in values]
    return out


def _hook_pil_save():
    """Image.save(path) displays the image too (E2B's sandbox does). PIL is
    patched when a cell first imports PIL.Image, not at kernel start."""
    if "PIL.Image" in sys.modules:
        _patch_pil(sys.modules["PIL.Image"])
        return
    sys.meta_path.insert(0, _PILFinder())


class _PILFinder:
    def find_spec(self, name, path=None, target=None):
        if name != "PIL.Image":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch_pil(module)

        spec.loader.exec_module = exec_module
        return spec


def _patch_pil(Image):
    if getattr(Image.Image.save, "_triad", False):
        return
    original = Image.Image.save

    def save(self, fp, format=None, **params):
        if isinstance(fp, str):
            try:
                from IPython.display import display

                display(self)
            except Exception:
                pass
        return original(self, fp, format, **params)

    save._triad = True
    Image.Image.save = save


def _json_safe(v):
    """Plain JSON values: numpy scalars and arrays, Decimals, dates and
    non-finite floats (None) made serialisable."""
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(v, np.datetime64):
            return str(v.astype("datetime64[s]"))
        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.floating):
            f = float(v)
            return f if math.isfinite(f) else None
        if isinstance(v, np.ndarray):
            return _json_safe(v.tolist())
    return str(v)


def _round8(x):
    """x to 8 significant digits, as a Decimal (exact to compare)."""
    d = Decimal(str(x))
    with localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())
        return +d


# --- charts ---------------------------------------------------------------


def figure_chart(fig):
    """The chart of a figure: {} when it holds no data."""
    axes = fig.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return {}
    if len(axes) > 1:
        return {
            "type": "superchart",
            "title": fig.get_suptitle() or None,
            "elements": [axes_chart(ax) for ax in axes],
        }
    return axes_chart(axes[0])


def _is_grid_line(line):
    xs, ys = line.get_xdata(), line.get_ydata()
    if len(xs) != 2 or len(ys) != 2:
        return False
    return xs[0] == xs[1] or ys[0] == ys[1]


def _kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    artists = [a for a in ax._children if not isinstance(a, Text)]
    if all(isinstance(a, Line2D) for a in artists):
        return "line"
    if all(isinstance(a, (PathPatch, Line2D)) for a in artists):
        return "box_and_whisker"
    artists = [a for a in artists if not (isinstance(a, Line2D) and _is_grid_line(a))]
    if all(isinstance(a, PathCollection) for a in artists):
        return "scatter"
    if all(isinstance(a, Wedge) for a in artists):
        return "pie"
    if all(isinstance(a, Rectangle) for a in artists):
        return "bar"
    return "unknown"


def axes_chart(ax):
    kind = _kind(ax)
    if kind in ("line", "scatter"):
        return _point_chart(ax, kind)
    if kind == "bar":
        return _bar_chart(ax)
    if kind == "pie":
        return _pie_chart(ax)
    if kind == "box_and_whisker":
        return _box_chart(ax)
    return {"type": "unknown", "title": ax.get_title() or None, "elements": []}


_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _unit(label):
    if not label:
        return None
    m = _UNIT.search(label)
    return (m.group(1) or m.group(2)) if m else None


def _chart2d(ax, kind):
    x, y = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {
        "type": kind,
        "title": ax.get_title() or None,
        "x_label": x,
        "y_label": y,
        "x_unit": _unit(x),
        "y_unit": _unit(y),
        "elements": [],
    }


def _swap_axes(chart):
    chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
    chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]


def _is_date_axis(axis):
    try:
        from matplotlib.dates import _SwitchableDateConverter as conv
    except Exception:
        from matplotlib.dates import DateConverter as conv
    return isinstance(axis.get_converter() if hasattr(axis, "get_converter") else axis.converter, conv)


def _ticks(axis, ticks):
    if _is_date_axis(axis):
        from matplotlib.dates import num2date

        return [num2date(t).isoformat() for t in ticks]
    if len(ticks) and isinstance(ticks[0], (int, float)):
        return [float(t) for t in ticks]
    return list(ticks)


def _scale(axis, scale, ticks, labels):
    if _is_date_axis(axis):
        return "datetime"
    if scale != "linear":
        return scale
    for i, (tick, label) in enumerate(zip(ticks, labels)):
        if isinstance(tick, (int, float)) and tick == i and str(i) != label:
            continue
        return "linear"
    return "categorical"


def _point(v):
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.datetime64):
        return str(v.astype("datetime64[s]"))
    return v


def _point_chart(ax, kind):
    chart = _chart2d(ax, kind)
    for name, axis, get_ticks, get_labels, get_scale in (
        ("x", ax.xaxis, ax.get_xticks, ax.get_xticklabels, ax.get_xscale),
        ("y", ax.yaxis, ax.get_yticks, ax.get_yticklabels, ax.get_yscale),
    ):
        labels = [t.get_text() for t in get_labels()]
        ticks = _ticks(axis, get_ticks())
        chart[name + "_ticks"] = ticks
        chart[name + "_tick_labels"] = labels
        chart[name + "_scale"] = _scale(axis, get_scale(), ticks, labels)
    if kind == "line":
        for line in ax.get_lines():
            if _is_grid_line(line):
                continue
            label = line.get_label()
            if label.startswith("_child"):
                label = "Line " + str(int(label[6:]))
            points = [[_point(x), _point(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
            chart["elements"].append({"label": label, "points": points})
    else:
        for coll in ax.collections:
            points = [[_point(x), _point(y)] for x, y in coll.get_offsets()]
            chart["elements"].append({"label": coll.get_label(), "points": points})
    return chart


def _bar_chart(ax):
    chart = _chart2d(ax, "bar")
    for container in ax.containers:
        group = container.get_label()
        if group.startswith("_container"):
            group = "Group " + str(int(group[10:]))
        heights = [r.get_height() for r in container]
        if all(h == heights[0] for h in heights):
            # Equal heights: horizontal bars (barh), whose values are widths.
            _swap_axes(chart)
            labels = [t.get_text() for t in ax.get_yticklabels()]
            values = [r.get_width() for r in container]
        else:
            labels = [t.get_text() for t in ax.get_xticklabels()]
            values = heights
        for label, value in zip(labels, values):
            chart["elements"].append({"label": label, "group": group, "value": float(value)})
    return chart


def _pie_chart(ax):
    chart = {"type": "pie", "title": ax.get_title() or None, "elements": []}
    for wedge in ax.patches:
        angle = abs(_round8(Decimal(float(wedge.theta2)) - Decimal(float(wedge.theta1))))
        chart["elements"].append({"label": wedge.get_label(), "angle": float(angle), "radius": float(wedge.r)})
    return chart


def _box_chart(ax):
    chart = _chart2d(ax, "box_and_whisker")
    labels = [t.get_text() for t in ax.get_xticklabels()]
    boxes = []
    for label, patch in zip(labels, ax.patches):
        verts = patch.get_path().vertices
        xs = [_round8(v) for v in verts[:, 0]]
        ys = [_round8(v) for v in verts[:, 1]]
        x, y = min(xs), min(ys)
        boxes.append({"x": x, "y": y, "label": label, "width": max(xs) - x, "height": max(ys) - y, "outliers": []})
    vertical = bool(boxes) and all(b["height"] == boxes[0]["height"] for b in boxes)
    if vertical:
        # Equal heights: the boxes lie along y (vert=False); read them turned.
        _swap_axes(chart)
        for b in boxes:
            b["x"], b["y"] = b["y"], b["x"]
            b["width"], b["height"] = b["height"], b["width"]
    for line in ax.lines:
        xs = [_round8(v) for v in line.get_xdata()]
        ys = [_round8(v) for v in line.get_ydata()]
        if vertical:
            xs, ys = ys, xs
        if len(xs) == 1:
            # A flier: an outlier of the box it stands in.
            for b in boxes:
                if b["x"] <= xs[0] <= b["x"] + b["width"]:
                    b["outliers"].append(ys[0])
                    break
            continue
        if len(ys) != 2:
            continue
        box = next((b for b in boxes if b["x"] <= xs[0] <= xs[1] <= b["x"] + b["width"]), None)
        if box is None:
            continue
        if ys[0] == ys[1] and box["y"] <= ys[0] <= box["y"] + box["height"]:
            box["median"] = ys[0]
            continue
        lo, hi = min(ys), max(ys)
        if hi == box["y"]:
            box["whisker_lower"] = lo
        elif lo == box["y"] + box["height"]:
            box["whisker_upper"] = hi
    for b in boxes:
        chart["elements"].append(
            {
                "label": b["label"],
                "min": float(b.get("whisker_lower", b["y"])),
                "first_quartile": float(b["y"]),
                "median": float(b.get("median", b["y"])),
                "third_quartile": float(b["y"] + b["height"]),
                "max": float(b.get("whisker_upper", b["y"] + b["height"])),
                "outliers": [float(o) for o in b["outliers"]],
            }
        )
    return chart
