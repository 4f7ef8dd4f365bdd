"""aepar.report.chart: the Pillow line charts of metrics.png (ticks, where lines land, the
legend's place) and metrics_png drawing without matplotlib."""
import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")

from aepar.report import chart  # noqa: E402
from aepar.report.chart import Line, Panel, line_chart_png, linear_ticks, log_ticks, tick_label  # noqa: E402

BLUE = np.array([0x1f, 0x77, 0xb4])


def _pixels(path):
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int64)


def _blue_mask(pixels):
    return np.abs(pixels - BLUE).sum(axis=2) < 60


@pytest.mark.parametrize("lo,hi,integer", [(0.4, 0.5, False), (-3.2, 17.0, False), (1, 400, True), (0.96, 20.04, True),
                                           (1e-6, 3e-6, False), (5, 6, True), (0.3, 14.3, True)])
def test_linear_ticks_are_round_steps_inside_the_range(lo, hi, integer):
    ticks = linear_ticks(lo, hi, 6, integer=integer)
    assert 2 <= len(ticks) <= 12
    steps = np.diff(ticks)
    assert np.allclose(steps, steps[0])
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5))
    assert lo - 1e-12 <= ticks[0] and ticks[-1] <= hi + 1e-12
    assert ticks[0] - steps[0] < lo and ticks[-1] + steps[0] > hi  # no round value left out
    if integer:
        assert all(float(t).is_integer() for t in ticks)


def test_log_ticks_are_decades_or_one_two_five():
    assert log_ticks(0.02, 30) == pytest.approx([0.1, 1, 10])
    assert log_ticks(0.015, 0.55) == pytest.approx([0.02, 0.05, 0.1, 0.2, 0.5])


def test_tick_labels_carry_the_steps_decimals():
    assert tick_label(0.42, 0.02) == "0.42"
    assert tick_label(0.4, 0.02) == "0.40"
    assert tick_label(100.0, 50.0) == "100"
    assert tick_label(2.5, 2.5) == "2.5"
    assert tick_label(1e-7, 1e-7) == "1e-07"


def test_a_rising_line_rises_and_a_falling_one_falls(tmp_path):
    """Pixel rows grow downwards: a line whose y grows with x must end higher on the image."""
    for ys, rising in (([0.0, 10.0], True), ([10.0, 0.0], False)):
        path = tmp_path / "line.png"
        line_chart_png([Panel("t", "x", "y", [Line([0.0, 10.0], ys, "")], integer_x=False)], path)
        rows, cols = np.nonzero(_blue_mask(_pixels(path)))
        left, right = rows[cols < np.percentile(cols, 20)].mean(), rows[cols > np.percentile(cols, 80)].mean()
        assert (right < left) == rising


def test_a_power_law_is_straight_on_the_log_axis(tmp_path):
    """y = 10^x over four decades: straight on a log axis (the bands' centres on one line),
    curved where the axis is linear."""
    xs = list(np.linspace(0, 4, 60))
    curvature = {}
    for log in (True, False):
        path = tmp_path / f"log{log}.png"
        line_chart_png([Panel("t", "x", "y", [Line(xs, [10.0 ** x for x in xs], "")], log_y=log, integer_x=False)],
                       path)
        rows, cols = np.nonzero(_blue_mask(_pixels(path)))
        bands = np.linspace(cols.min(), cols.max(), 7)
        centre = [(cols[(cols >= a) & (cols < b)].mean(), rows[(cols >= a) & (cols < b)].mean())
                  for a, b in zip(bands[1:-2], bands[2:-1])]
        (x0, y0), (x1, y1) = centre[0], centre[-1]
        curvature[log] = max(abs(y - (y0 + (y1 - y0) * (x - x0) / (x1 - x0))) for x, y in centre)
    assert curvature[True] < 3 < curvature[False]


def test_a_dashed_line_has_gaps_and_a_solid_one_none(tmp_path):
    runs = {}
    for dashed in (False, True):
        path = tmp_path / f"d{dashed}.png"
        line_chart_png([Panel("t", "x", "y", [Line([0.0, 10.0], [5.0, 5.0], "", dashed=dashed),
                                               Line([0.0, 10.0], [0.0, 1.0], "", color=1)], integer_x=False)],
                       path)
        mask = _blue_mask(_pixels(path))
        row = mask[np.argmax(mask.sum(axis=1))]
        on = np.nonzero(row)[0]
        runs[dashed] = int(np.count_nonzero(np.diff(on) > 1)) + 1  # separate stretches of blue
    assert runs[False] == 1 and runs[True] >= 10


def test_the_legend_goes_where_it_covers_no_points():
    box, w, h = (0, 0, 1000, 600), 200, 100
    crowded_upper_right = [(900, 50), (950, 60)]
    assert chart._legend_corner(box, w, h, []) == ((1000 - 6 * chart.SS - w, 6 * chart.SS), 0)  # upper right
    (left, top), covered = chart._legend_corner(box, w, h, crowded_upper_right)
    assert left < 500 and top < 300 and covered == 0
    everywhere_but_lower_left = crowded_upper_right + [(50, 50), (900, 550)]
    assert chart._legend_corner(box, w, h, everywhere_but_lower_left) == ((6 * chart.SS, 600 - 6 * chart.SS - h), 0)
    corners_taken = everywhere_but_lower_left + [(50, 550)]
    assert chart._legend_corner(box, w, h, corners_taken)[1] == 0  # a side's middle or the centre is free


def test_a_chart_needs_points(tmp_path):
    with pytest.raises(ValueError, match="at least one line"):
        line_chart_png([Panel("t", "x", "y", [Line([], [], "")])], tmp_path / "x.png")


def test_metrics_png_draws_panels_side_by_side_without_matplotlib(tmp_path):
    code = f"""
import sys
from aepar.report.figures import metrics_png
rows = [dict(phase="pretrain", stage=s, epoch=str(e), train_loss=str(1.0 / (e * int(s))), val_loss="",
             train_error="", val_error="") for s in "12" for e in range(1, 6)]
rows += [dict(phase="finetune", stage="", epoch=str(e), train_loss=str(1 / e), val_loss=str(1.1 / e),
              train_error=str(0.1 / e), val_error="nan") for e in range(1, 4)]
metrics_png(rows, {str(tmp_path / 'm.png')!r}, title="a run")
print("matplotlib" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    pixels = _pixels(tmp_path / "m.png")
    assert pixels.shape == (chart.PANEL[1] + chart.TITLE_HEIGHT, 3 * chart.PANEL[0], 3)  # pretrain, 2 finetune panels


def test_a_legend_with_no_free_place_inside_goes_beside_the_axes(tmp_path):
    """Lines all over the plot area: with labels the axes narrow and the legend stands to
    their right; without labels (no legend) the axes keep their width."""
    xs = list(np.linspace(0, 10, 41))
    lines = [Line(xs, [(i + 3 * k) % 7 for i in range(41)], f"line {k}", color=k) for k in range(4)]

    def frame_right(path):
        pixels = _pixels(path)
        black = (pixels.sum(axis=2) < 500) & (np.ptp(pixels, axis=2) < 20)  # dark grey: the frame, not a line
        height = black.shape[0]
        columns = black[height // 4: 3 * height // 4].sum(axis=0)  # the frame's sides run the whole height
        return int(np.nonzero(columns > height // 3)[0].max())
    line_chart_png([Panel("t", "x", "y", lines, integer_x=False)], tmp_path / "legend.png")
    line_chart_png([Panel("t", "x", "y", [Line(l.xs, l.ys, "") for l in lines], integer_x=False)],
                   tmp_path / "none.png")
    assert frame_right(tmp_path / "legend.png") < frame_right(tmp_path / "none.png") - 40
