"""What every figure of the report shares: PNG rendering, the colours and line styles of methods (by family of
:data:`headprune.schema.METHOD_TABLE`), importance ranks, number formats, cell labels.

Figures are ``matplotlib.figure.Figure`` objects rendered by Agg, never registered with pyplot (nothing to close).
"""

from __future__ import annotations

import io
import json
import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headprune.schema import FAMILY_COLORS, method_family

DPI = 110
MISSING_COLOR = "#d9d9d9"
SCALES = ("value", "rank")  # heatmaps and scatters: each method's own values, or ranks on one shared scale


@dataclass
class Picture:
    name: str  # file name in out_dir
    caption: str
    png: bytes
    svg: str | None = None  # report.html shows this inline markup (hover values) instead of the PNG
    phone_png: bytes | None = None  # a version readable 400 px wide: report.html shows it on narrow screens

    @property
    def phone_name(self) -> str:
        return self.name.removesuffix(".png") + "_phone.png"


@dataclass(frozen=True)
class Fonts:
    """Font sizes in points of a figure's parts."""

    title: float
    label: float
    tick: float
    cell: float  # numbers written in heatmap cells
    legend: float


WIDE_FONTS = Fonts(title=9, label=8, tick=7, cell=6, legend=8)
#: A phone figure is PHONE_WIDTH inches wide, 5 in with the 0.1 in margins of the saved PNG, shown 368 CSS px wide
#: on a 400 px screen (page padding 2 x 16 px): one point of text is 368 / 360 CSS px there, so PHONE_FONTS keep
#: every text at 9 px or more.
PHONE_FONTS = Fonts(title=11, label=10, tick=9, cell=9, legend=9)
PHONE_WIDTH = 4.8
PHONE_DPI = 2 * 72  # 736 px wide: sharp on a 2x screen
TEXT_KEY = "headprune-text"  # PNG tEXt chunk: {"smallest_pt": the smallest text drawn, "dpi": the dpi}


def wrapped(text: str, fontsize: float, width_in: float) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize`` points (a character ~0.55 em)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(10, int(width_in * 72 / (0.55 * fontsize)))))


def render_png(fig: Figure, dpi: float = DPI) -> bytes:
    """``fig`` as PNG bytes, with a tEXt chunk (:data:`TEXT_KEY`) that records the smallest font drawn (points)
    and the dpi, so a page can tell how tall the figure's text is where it shows the PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    png = buf.getvalue()
    smallest = smallest_font(fig)
    if smallest is None:
        return png
    data = TEXT_KEY.encode() + b"\0" + json.dumps({"smallest_pt": smallest, "dpi": dpi}).encode()
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    end_of_header = 8 + 4 + 4 + 13 + 4  # signature, then IHDR: length, type, 13 bytes of data, CRC
    return png[:end_of_header] + chunk + png[end_of_header:]


def smallest_font(fig: Figure) -> float | None:
    """The smallest font size (points) of the texts a drawn ``fig`` shows (visible, non-empty, in a visible axes)."""
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible())
             and not (t.get_figure() is None)]
    return float(min(sizes)) if sizes else None


def text_scale(png: bytes) -> dict | None:
    """The :data:`TEXT_KEY` record of a PNG from :func:`render_png` (None: the PNG has none)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        raw = image.info.get(TEXT_KEY)
    return json.loads(raw) if raw else None


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")
COMPENSATED_STYLE = (0, (6, 1.5, 1, 1.5, 1, 1.5))  # dash-dot-dot: never a family's own style


def method_color(method: str) -> str:
    """The colour of ``method``'s family (a ranking ``<method>@layer``: its method's)."""
    return FAMILY_COLORS.get(method_family(method), FAMILY_COLORS["other"])


def curve_styles(methods: list[str]) -> dict[str, dict]:
    """Colour (by family), line style and marker (by place in the family) of each non-random method."""
    seen: dict[str, int] = {}
    styles = {}
    for method in methods:
        family = method_family(method)
        i = seen[family] = seen.get(family, -1) + 1
        styles[method] = {"color": method_color(method),
                          "ls": LINE_STYLES[i % len(LINE_STYLES)], "marker": MARKERS[i % len(MARKERS)]}
    return styles


def head_grid(scores: pd.DataFrame, method: str) -> pd.DataFrame:
    """Layers x heads of ``method`` (0..max layer, 0..max head); NaN where a head is missing."""
    layers, heads = range(int(scores["layer"].max()) + 1), range(int(scores["head"].max()) + 1)
    return scores.pivot(index="layer", columns="head", values=method).reindex(index=layers, columns=heads)


def importance_rank(values: np.ndarray) -> np.ndarray:
    """Rank of each value within its method, 1 = highest (ties share their mean rank); NaN stays NaN."""
    from scipy.stats import rankdata

    ranks = np.full(len(values), np.nan)
    ok = np.isfinite(values)
    if ok.any():
        ranks[ok] = rankdata(-values[ok], method="average")
    return ranks


def display_exponent(values: np.ndarray) -> int:
    """k such that values / 10**k has its largest magnitude in [1, 10) (0 where that holds already, or no value)."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if len(finite) else 0.0
    return 0 if top == 0 or 1 <= top < 10 else math.floor(math.log10(top))


def scaled_label(unit: str, k: int) -> str:
    """``unit`` with the power of ten the shown numbers leave out, e.g. ``ΔNLL, nats/token (×10⁻²)``."""
    return unit if k == 0 else f"{unit} ($\\times 10^{{{k}}}$)"


def annotate_cells(ax, values: np.ndarray, cmap, vmin: float, vmax: float, fmt: str = "{:.3g}",
                    fontsize: float = 6.5) -> None:
    """Write each finite value in its cell, white on dark colours and black on light ones."""
    span = (vmax - vmin) or 1.0
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            r, g, b, _ = cmap(float(np.clip((v - vmin) / span, 0, 1)))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
            text = fmt.format(v)
            text = text[1:] if text.startswith("-") and not text.strip("-0.") else text  # no "-0.00"
            label = ax.text(j, i, text, ha="center", va="center", fontsize=fontsize, color="white" if dark else "black")
            label.set_in_layout(False)  # inside its cell: the layout need not measure it (10% of a heatmap's time)
