"""Line charts drawn with Pillow: the training curves every run leaves behind (metrics.png).

A run draws its curves on its way out, so the drawing is part of every command's time:
matplotlib's import alone is a noticeable part of a short command, Pillow's (a matplotlib
dependency, in the ``plots`` extra) a small one. The chart is drawn at twice its size and
reduced, which smooths the lines; the text is FreeType's where Pillow has it. The other
figures (image grids, profiles, the benchmarks') stay with matplotlib.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Line", "Panel", "line_chart_png", "linear_ticks", "log_ticks", "tick_label"]

# matplotlib's default cycle, so that a run's curves and the benchmarks' share colours
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")
SS = 2                          # drawn at SS times the size, then reduced
PANEL = (520, 380)              # one panel's size in pixels
MARGIN = dict(left=64, right=14, top=30, bottom=46)
TITLE_HEIGHT = 26               # the whole figure's title, when there is one
DATA_PAD = 0.05                 # room around the data, as a share of its range


@dataclass
class Line:
    """One curve: points (x, y), its legend label, dashed or not, a colour index (COLORS)."""
    xs: list
    ys: list
    label: str
    color: int = 0
    dashed: bool = False


@dataclass
class Panel:
    """One set of axes: its title, axis labels and lines; ``log_y`` for a logarithmic y."""
    title: str
    xlabel: str
    ylabel: str
    lines: list = field(default_factory=list)
    log_y: bool = False
    integer_x: bool = True
    legend_columns: int = 1


def _nice_step(span: float, count: int) -> float:
    """The step of 1, 2, 2.5 or 5 times a power of ten nearest above span / count."""
    raw = span / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw * (1 - 1e-9))


def linear_ticks(lo: float, hi: float, count: int = 6, integer: bool = False) -> list:
    """Round values at one step from lo to hi (both included where they fall on it), about
    ``count`` of them; whole numbers only with ``integer``."""
    if not hi > lo:
        return [lo]
    step = _nice_step(hi - lo, count)
    if integer:  # 1, 2, 5, 10, ...: a step of 2.5 becomes 5, anything under 1 becomes 1
        step = max(1.0, step if step.is_integer() else 2.0 * step)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + 1e-9 * step:
        ticks.append(k * step)
        k += 1
    return ticks


def log_ticks(lo: float, hi: float) -> list:
    """Powers of ten from lo to hi (positive); with fewer than two of them, 1, 2 and 5 times
    each power as well."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))

    def inside(v):
        return lo <= v * (1 + 1e-12) and v <= hi * (1 + 1e-12)
    decades = [10.0 ** e for e in range(first, last + 1) if inside(10.0 ** e)]
    if len(decades) >= 2:
        return decades
    return [m * 10.0 ** e for e in range(first, last + 1) for m in (1.0, 2.0, 5.0) if inside(m * 10.0 ** e)]


def tick_label(value: float, step: float | None = None) -> str:
    """A tick's text: as many decimals as the step needs (linear axes), else ``%g``."""
    if step is None or value != 0 and not 1e-4 <= abs(value) < 1e6:
        return f"{value:g}"
    decimals = 0
    while decimals < 8 and abs(round(step, decimals) - step) > 1e-9 * step:
        decimals += 1
    return f"{value:.{decimals}f}"


class _Axes:
    """Data -> pixel mapping of one panel's plot area (pixels of the drawing, SS times the
    output's)."""

    def __init__(self, box, xlim, ylim, log_y):
        self.box, self.xlim, self.ylim, self.log_y = box, xlim, ylim, log_y

    def _y(self, y):
        return math.log10(y) if self.log_y else y

    def px(self, x, y):
        left, top, right, bottom = self.box
        (x0, x1), (y0, y1) = self.xlim, (self._y(self.ylim[0]), self._y(self.ylim[1]))
        return (left + (x - x0) / (x1 - x0) * (right - left),
                bottom - (self._y(y) - y0) / (y1 - y0) * (bottom - top))


def _limits(values, log: bool):
    lo, hi = min(values), max(values)
    if log:
        a, b = math.log10(lo), math.log10(hi)
        pad = (b - a) * DATA_PAD
        return 10.0 ** (a - pad), 10.0 ** (b + pad)
    if hi == lo:
        pad = abs(lo) * 0.05 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * DATA_PAD
    return lo - pad, hi + pad


def _dashes(points, on: float, off: float):
    """The pieces of a polyline that a dash pattern draws."""
    pieces, current, left, drawing = [], [points[0]], on, True
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:]):
        length = math.hypot(x1 - x0, y1 - y0)
        done = 0.0
        while length - done > left:
            done += left
            t = done / length
            p = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)
            if drawing:
                current.append(p)
                pieces.append(current)
            current = [p]
            drawing, left = not drawing, (off if drawing else on)
        left -= length - done
        if drawing:
            current.append((x1, y1))
    if drawing and len(current) > 1:
        pieces.append(current)
    return pieces


def _stroke(draw, line: Line, points):
    """``line``'s colour and dash pattern along ``points`` (pixels): the curve, or its
    sample in the legend."""
    pieces = _dashes(points, 6 * SS, 4 * SS) if line.dashed and len(points) > 1 else [points]
    for piece in pieces:
        if len(piece) > 1:
            draw.line(piece, fill=COLORS[line.color % len(COLORS)], width=max(1, round(1.4 * SS)), joint="curve")


def _panel(draw, image, panel: Panel, origin, fonts):
    from PIL import Image, ImageDraw

    ox, oy = origin
    w, h = PANEL[0] * SS, PANEL[1] * SS
    box = (ox + MARGIN["left"] * SS, oy + MARGIN["top"] * SS, ox + w - MARGIN["right"] * SS,
           oy + h - MARGIN["bottom"] * SS)
    xs = [x for line in panel.lines for x in line.xs]
    ys = [y for line in panel.lines for y in line.ys]
    xlim, ylim = _limits(xs, False), _limits(ys, panel.log_y)
    legend = _Legend(draw, panel, fonts["legend"], panel.legend_columns)
    if legend.entries:
        trace = _trace(panel, _Axes(box, xlim, ylim, panel.log_y))
        shapes = [legend] + [_Legend(draw, panel, fonts["legend"], cols) for cols in (1, 2) if cols != legend.cols]
        fits = [(shape, *shape.inside(box, trace)) for shape in shapes]
        free = [(shape, place) for shape, place, covered in fits if not covered]
        if free:
            legend, place = free[0]
        else:  # no free place inside: the legend goes beside the axes, which narrow for it
            tall = [shape for shape in shapes if shape.height <= box[3] - box[1]]
            legend = min(tall or shapes, key=lambda shape: shape.width)
            box = (box[0], box[1], box[2] - legend.width - 8 * SS, box[3])
            place = (box[2] + 6 * SS, box[1])
    axes = _Axes(box, xlim, ylim, panel.log_y)
    left, top, right, bottom = box
    grid, text = (225, 225, 225), (0, 0, 0)
    xticks = linear_ticks(xlim[0], xlim[1], 7, integer=panel.integer_x)
    if panel.log_y:
        yticks, ystep = log_ticks(*ylim), None
    else:
        yticks = linear_ticks(*ylim, 6)
        ystep = yticks[1] - yticks[0] if len(yticks) > 1 else None
    xstep = xticks[1] - xticks[0] if len(xticks) > 1 else None
    for x in xticks:
        px = axes.px(x, ylim[0])[0]
        draw.line([(px, top), (px, bottom)], fill=grid, width=SS)
        draw.line([(px, bottom), (px, bottom + 4 * SS)], fill=text, width=SS)
        draw.text((px, bottom + 6 * SS), tick_label(x, xstep), fill=text, font=fonts["tick"], anchor="mt")
    widest = 0
    for y in yticks:
        py = axes.px(xlim[0], y)[1]
        draw.line([(left, py), (right, py)], fill=grid, width=SS)
        draw.line([(left - 4 * SS, py), (left, py)], fill=text, width=SS)
        label = tick_label(y, ystep)
        draw.text((left - 6 * SS, py), label, fill=text, font=fonts["tick"], anchor="rm")
        widest = max(widest, draw.textlength(label, font=fonts["tick"]))
    for line in panel.lines:
        points = [axes.px(x, y) for x, y in zip(line.xs, line.ys)]
        _stroke(draw, line, points)
        if len(points) < 40:
            r = 2.2 * SS
            for px, py in points:
                draw.ellipse((px - r, py - r, px + r, py + r), fill=COLORS[line.color % len(COLORS)])
    draw.rectangle(box, outline=text, width=SS)
    draw.text(((left + right) / 2, oy + (MARGIN["top"] - 8) * SS), panel.title, fill=text, font=fonts["title"],
              anchor="ms")
    draw.text(((left + right) / 2, bottom + 36 * SS), panel.xlabel, fill=text, font=fonts["label"], anchor="mb")
    label = Image.new("RGB", (int(draw.textlength(panel.ylabel, font=fonts["label"])) + 4 * SS, 18 * SS), "white")
    ImageDraw.Draw(label).text((2 * SS, 9 * SS), panel.ylabel, fill=text, font=fonts["label"], anchor="lm")
    label = label.rotate(90, expand=True)
    beside_ticks = left - 10 * SS - widest - label.width
    image.paste(label, (int(max(ox + 2 * SS, beside_ticks)), int((top + bottom - label.height) / 2)))
    if legend.entries:
        legend.draw(place)


def _trace(panel: Panel, axes) -> list:
    """Where the lines run, in pixels: every point and seven more along each segment."""
    out = []
    for line in panel.lines:
        points = [axes.px(x, y) for x, y in zip(line.xs, line.ys)]
        out += points + [(a[0] + (b[0] - a[0]) * t / 8, a[1] + (b[1] - a[1]) * t / 8)
                         for a, b in zip(points[:-1], points[1:]) for t in range(1, 8)]
    return out


def _legend_corner(box, width, height, points):
    """The top-left of the legend and how many of the lines' points it covers: of the plot
    area's corners (upper right first), then the middles of its sides and its centre, the
    place whose rectangle covers the fewest, as matplotlib's "best" does."""
    inset = 6 * SS
    left, right = box[0] + inset, box[2] - inset - width
    top, bottom = box[1] + inset, box[3] - inset - height
    mid_x, mid_y = (left + right) / 2, (top + bottom) / 2
    corners = [(right, top), (left, top), (left, bottom), (right, bottom),
               (right, mid_y), (left, mid_y), (mid_x, top), (mid_x, bottom), (mid_x, mid_y)]

    def covered(corner):
        x, y = corner
        return sum(x <= px <= x + width and y <= py <= y + height for px, py in points)
    best = min(corners, key=covered)  # min keeps the first of equals
    return best, covered(best)


class _Legend:
    """The labelled lines of a panel as a box of line samples and labels in ``cols``
    columns."""

    SAMPLE, GAP, PAD, ROW = 18 * SS, 5 * SS, 5 * SS, 13 * SS

    def __init__(self, draw, panel: Panel, font, cols: int):
        self.drawer, self.font = draw, font
        self.entries = [line for line in panel.lines if line.label]
        self.cols = max(1, cols)
        self.rows = math.ceil(len(self.entries) / self.cols)
        widest = max((draw.textlength(line.label, font=font) for line in self.entries), default=0)
        self.col_w = int(widest) + self.SAMPLE + self.GAP + self.PAD
        self.width = self.cols * self.col_w + self.PAD
        self.height = self.rows * self.ROW + 2 * self.PAD

    def inside(self, box, points):
        """The best place inside ``box`` and the points it covers (:func:`_legend_corner`)."""
        return _legend_corner(box, self.width, self.height, points)

    def draw(self, place):
        draw, (left, top) = self.drawer, place
        draw.rectangle((left, top, left + self.width, top + self.height), fill="white", outline=(200, 200, 200),
                       width=SS)
        for i, line in enumerate(self.entries):
            c, r = divmod(i, self.rows)
            x, y = left + self.PAD + c * self.col_w, top + self.PAD + r * self.ROW + self.ROW / 2
            _stroke(draw, line, [(x, y), (x + self.SAMPLE, y)])
            draw.text((x + self.SAMPLE + self.GAP, y), line.label, fill=(0, 0, 0), font=self.font, anchor="lm")


def _fonts():
    from PIL import ImageFont

    def font(size):
        try:
            return ImageFont.load_default(size * SS)
        except (TypeError, ValueError, OSError):  # a Pillow without FreeType: its fixed bitmap font
            return ImageFont.load_default()
    return {"tick": font(10), "label": font(11), "title": font(11), "legend": font(9), "suptitle": font(11)}


def line_chart_png(panels: list, path, *, title: str = ""):
    """Draw ``panels`` (:class:`Panel`, side by side) as one RGB PNG at ``path``."""
    from PIL import Image, ImageDraw

    panels = [p for p in panels if any(line.xs for line in p.lines)]
    if not panels:
        raise ValueError("a chart needs at least one line with points")
    top = TITLE_HEIGHT if title else 0
    size = (PANEL[0] * len(panels), PANEL[1] + top)
    image = Image.new("RGB", (size[0] * SS, size[1] * SS), "white")
    draw = ImageDraw.Draw(image)
    fonts = _fonts()
    if title:
        draw.text((size[0] * SS / 2, (top - 7) * SS), title, fill=(0, 0, 0), font=fonts["suptitle"], anchor="ms")
    for i, panel in enumerate(panels):
        _panel(draw, image, panel, (i * PANEL[0] * SS, top * SS), fonts)
    image.reduce(SS).save(path, format="PNG")  # each pixel the mean of its SS x SS: the antialiasing
