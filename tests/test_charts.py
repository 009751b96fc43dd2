"""The SVG charts of the demo's and the simulator's reports."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from fairlane.sim.svg import bar_chart, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def _bars(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    # the background and the legend swatches are rects too: bars carry a tooltip
    return [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]


def test_one_bar_per_value_and_a_gap_for_none() -> None:
    svg = bar_chart("t <&>", ["a", "b", "c"], {"fair": [1.0, 2.0, None], "fifo": [10.0, 0.0, 5.0]})
    bars = _bars(svg)
    assert len(bars) == 5
    assert "t &lt;&amp;&gt;" in svg


def test_taller_values_draw_taller_bars_on_both_scales() -> None:
    for log in (False, True):
        bars = _bars(bar_chart("t", ["a", "b"], {"s": [3.0, 3000.0]}, log=log))
        low, high = (float(b.attrib["height"]) for b in bars)
        assert 0 < low < high


def test_a_log_scale_spans_the_decades_shown() -> None:
    svg = bar_chart("t", ["a", "b"], {"s": [2.0, 5000.0]}, log=True)
    labels = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert "1" in labels and "10,000" in labels


def test_series_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ValueError, match="has 1 values for 2"):
        bar_chart("t", ["a", "b"], {"s": [1.0]})


def test_a_line_chart_draws_one_polyline_per_series() -> None:
    svg = line_chart("q", {"fair": [(0.0, 1.0), (5.0, 2.0)], "fifo": [(0.0, 0.0), (5.0, 40.0)]})
    lines = list(ET.fromstring(svg).iter(f"{SVG}polyline"))
    assert [len(line.attrib["points"].split()) for line in lines] == [2, 2]
