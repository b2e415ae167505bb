"""Chart primitives drawn as inline SVG strings: a line chart and a stacked bar chart.

No JS library and no network: the page embeds the SVG as is. Every drawn datum is an element
of class ``mark`` with a ``<title>`` (the browser's tooltip), so a test can count what rendered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 720, 340
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 16, 52
AXIS_COLOR, GRID_COLOR, TEXT_COLOR = "#444", "#e3e3e3", "#222"
LIMIT_COLOR = "#c0392b"


@dataclass(frozen=True)
class Series:
    """A named line: points (x, y) in data units, a colour and an SVG dash pattern ("" = solid)."""

    name: str
    points: list[tuple[float, float]]
    color: str
    dash: str = ""
    width: float = 2.0


@dataclass(frozen=True)
class HLine:
    """A horizontal reference line across the plot, labelled at its right end."""

    y: float
    label: str
    color: str = LIMIT_COLOR


@dataclass(frozen=True)
class Segment:
    """One part of a stacked bar: its name, height in data units, colour and tooltip."""

    name: str
    value: float
    color: str
    tip: str = ""


@dataclass(frozen=True)
class Bar:
    """A stacked bar; bars with the same group stand together under the group's label."""

    label: str
    group: str
    segments: list[Segment] = field(default_factory=list)
    limit: float | None = None  # a per-group ceiling (device memory), drawn as a dashed line

    @property
    def total(self) -> float:
        """Height of the whole stack."""
        return sum(s.value for s in self.segments)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def tick_label(value: float) -> str:
    """A short axis label: 0.0001 -> 1e-04, 12500 -> 12,500, 0.25 -> 0.25."""
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e6:
        return f"{value:.0e}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


class _Frame:
    """Maps data coordinates to pixels inside the margins, and draws the axes and grid."""

    def __init__(self, x_range: tuple[float, float], y_ticks: list[float], *, bottom: int = BOTTOM) -> None:
        self.x0, self.x1 = x_range
        self.y_ticks = y_ticks
        self.y0, self.y1 = y_ticks[0], y_ticks[-1]
        self.bottom = bottom
        self.plot_w = WIDTH - LEFT - RIGHT
        self.plot_h = HEIGHT - TOP - bottom

    def px(self, x: float) -> float:
        """Pixel column of data x."""
        span = (self.x1 - self.x0) or 1.0
        return LEFT + (x - self.x0) / span * self.plot_w

    def py(self, y: float) -> float:
        """Pixel row of data y (SVG rows grow downwards)."""
        span = (self.y1 - self.y0) or 1.0
        return TOP + self.plot_h - (y - self.y0) / span * self.plot_h

    def axes(self, *, x_label: str, y_label: str) -> list[str]:
        """Grid lines, y tick labels, both axes and their titles."""
        parts = []
        for tick in self.y_ticks:
            y = self.py(tick)
            parts.append(
                f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID_COLOR}"/>'
            )
            parts.append(
                f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" '
                f'font-size="11">{tick_label(tick)}</text>'
            )
        base = TOP + self.plot_h
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base}" y2="{base}" stroke="{AXIS_COLOR}"/>'
        )
        parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{base}" stroke="{AXIS_COLOR}"/>')
        parts.append(
            f'<text x="{LEFT + self.plot_w / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle" '
            f'font-size="12">{escape(x_label)}</text>'
        )
        mid = TOP + self.plot_h / 2
        parts.append(
            f'<text x="14" y="{mid:.0f}" text-anchor="middle" font-size="12" '
            f'transform="rotate(-90 14 {mid:.0f})">{escape(y_label)}</text>'
        )
        return parts


def _svg(title: str, parts: Sequence[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="{escape(title)}" font-family="sans-serif" '
        f'fill="{TEXT_COLOR}"><title>{escape(title)}</title>' + "".join(parts) + "</svg>"
    )


def _hline(frame: _Frame, line: HLine, x_from: float = LEFT, x_to: float = WIDTH - RIGHT) -> list[str]:
    y = frame.py(line.y)
    return [
        f'<line class="limit" x1="{x_from:.1f}" x2="{x_to:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
        f'stroke="{line.color}" stroke-width="1.5" stroke-dasharray="6 4"/>',
        f'<text x="{x_to - 2:.1f}" y="{y - 4:.1f}" text-anchor="end" font-size="11" '
        f'fill="{line.color}">{escape(line.label)}</text>',
    ]


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    x_ticks: Sequence[tuple[float, str]] | None = None,
    hlines: Sequence[HLine] = (),
    y_from_zero: bool = True,
) -> str:
    """Lines with point markers; ``x_ticks`` places labelled ticks (e.g. gpus as categories)."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points] + [h.y for h in hlines]
    if not xs:
        return _svg(title, [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text>'])
    y_lo = min(0.0, *ys) if y_from_zero else min(ys)
    y_hi = max(ys)
    if not y_from_zero:  # a little air below and above a curve that does not start at 0
        pad = (y_hi - y_lo) * 0.05 or abs(y_hi) * 0.05 or 1.0
        y_lo, y_hi = y_lo - pad, y_hi + pad
    ticks = nice_ticks(y_lo, y_hi)
    if x_ticks:
        x_lo, x_hi = min(t for t, _ in x_ticks), max(t for t, _ in x_ticks)
        pad = 0.5 if x_hi > x_lo else 1.0  # categories sit half a slot inside the frame
        frame = _Frame((x_lo - pad, x_hi + pad), ticks)
        tick_marks = list(x_ticks)
    else:
        frame = _Frame((min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1), ticks)
        tick_marks = [(t, tick_label(t)) for t in nice_ticks(min(xs), max(xs), 8) if min(xs) <= t <= max(xs)]
    parts = frame.axes(x_label=x_label, y_label=y_label)
    base = TOP + frame.plot_h
    for x, label in tick_marks:
        px = frame.px(x)
        parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{base}" y2="{base + 4}" stroke="{AXIS_COLOR}"/>')
        parts.append(
            f'<text x="{px:.1f}" y="{base + 16}" text-anchor="middle" font-size="11">{escape(label)}</text>'
        )
    for line in hlines:
        parts += _hline(frame, line)
    for s in sorted(series, key=lambda s: -s.width):  # thick lines first: coinciding lines stay visible
        points = sorted(s.points)
        coords = " ".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in points)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        parts.append(
            f'<polyline class="mark" points="{coords}" fill="none" stroke="{s.color}" '
            f'stroke-width="{s.width}"{dash}>'
            f"<title>{escape(s.name)}</title></polyline>"
        )
        if len(points) <= 40:
            for x, y in points:
                parts.append(
                    f'<circle class="mark" cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" '
                    f'r="{max(2.5, s.width / 2 + 1):.1f}" '
                    f'fill="{s.color}"><title>{escape(s.name)}: {tick_label(x)}, {y:.6g}</title></circle>'
                )
    return _svg(title, parts)


def stacked_bar_chart(
    bars: Sequence[Bar], *, title: str, y_label: str, limit_label: str = "device", unit: str = ""
) -> str:
    """Stacked bars in groups, each group with its own dashed limit line; a limit far above the
    tallest bar is drawn as an arrow at the top instead, so the bars stay readable."""
    if not bars:
        return _svg(title, [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text>'])
    tallest = max(b.total for b in bars) or 1.0
    # Put a limit on the axis only when the tallest bar would still fill a third of it.
    limits = [b.limit for b in bars if b.limit is not None and b.limit <= 3 * tallest]
    ticks = nice_ticks(0.0, max([tallest * 1.08, *[lim * 1.05 for lim in limits]]))
    groups: list[str] = []
    for bar in bars:
        if bar.group not in groups:
            groups.append(bar.group)
    slots = len(bars) + len(groups) - 1  # one empty slot between groups
    slot_w = (WIDTH - LEFT - RIGHT) / max(slots, 1)
    crowded = slot_w < 24  # no room for a label under each bar
    names = {g: g if len(g) <= 14 else "…" + g[-13:] for g in groups}
    # Group names that would overlap their neighbours are written at 45 degrees.
    slanted = any(len(names[g]) * 7 > slot_w * (1 + sum(b.group == g for b in bars)) for g in groups)
    frame = _Frame((0.0, 1.0), ticks, bottom=BOTTOM + (48 if slanted else 18))
    parts = frame.axes(x_label="", y_label=y_label)
    bar_w = min(slot_w * 0.8, 60)
    base = TOP + frame.plot_h
    slot = 0
    for g_index, group in enumerate(groups):
        members = [b for b in bars if b.group == group]
        first_x = LEFT + slot * slot_w
        for bar in members:
            x = LEFT + slot * slot_w + (slot_w - bar_w) / 2
            y_cursor = 0.0
            for segment in bar.segments:
                if segment.value <= 0:
                    continue
                top = frame.py(y_cursor + segment.value)
                height = frame.py(y_cursor) - top
                tip = segment.tip or f"{segment.name}: {segment.value:.4g}"
                parts.append(
                    f'<rect class="mark" x="{x:.1f}" y="{top:.1f}" width="{bar_w:.1f}" '
                    f'height="{max(height, 0.5):.1f}" fill="{segment.color}" stroke="#fff" '
                    'stroke-width="0.5">'
                    f"<title>{escape(group)} {escape(bar.label)}: {escape(tip)}</title></rect>"
                )
                y_cursor += segment.value
            if not crowded:
                parts.append(
                    f'<text x="{x + bar_w / 2:.1f}" y="{base + 13}" text-anchor="middle" '
                    f'font-size="10">{escape(bar.label)}</text>'
                )
            slot += 1
        last_x = LEFT + slot * slot_w
        mid, y = (first_x + last_x) / 2, base + (14 if crowded else 28)
        slant = f' transform="rotate(-45 {mid:.1f} {y})"' if slanted else ""
        parts.append(
            f'<text x="{mid:.1f}" y="{y}" text-anchor="{"end" if slanted else "middle"}"{slant} '
            f'font-size="11" font-weight="bold"><title>{escape(group)}</title>{escape(names[group])}</text>'
        )
        limit = members[0].limit
        if limit is not None:
            if limit <= frame.y1:
                parts += _hline(frame, HLine(limit, ""), first_x, last_x)
            else:
                parts.append(
                    f'<text class="limit" x="{mid:.1f}" y="{TOP + 10}" text-anchor="middle" font-size="10" '
                    f'fill="{LIMIT_COLOR}">↑ {limit_label} {tick_label(limit)} {unit}</text>'
                )
        slot += 1 if g_index < len(groups) - 1 else 0
    return _svg(title, parts)
