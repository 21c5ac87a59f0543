"""report.html: the sections of :func:`.render.sections` as one self-contained page.

Works offline and on a phone: a viewport meta tag, a table of contents, every table in a horizontally
scrolling box, pictures as data: URIs, and a few lines of inline JavaScript (no CDN) that sort a table by the
column whose header is clicked (numbers numerically, text alphabetically; again: reversed).
"""

from __future__ import annotations

import base64
import html
import io
import math
import re

import pandas as pd
from PIL import Image

from headprune.report.numbers import format_table
from headprune.report.plots import Picture
from headprune.report.plots.common import text_scale
from headprune.report.render import Answers, Block, Commands, Facts, Findings, Fold, Note, Paragraph, Section, Table

MIN_TEXT_PX = 9  # the smallest text of a figure on a 400 px phone, CSS px
PHONE_CONTENT_PX = 368  # a 400 px screen less the page padding (2 x 16 px)

CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222;
line-height:1.45}
.scroll{overflow-x:auto;max-width:100%;margin:.5em 0 1.5em;background:linear-gradient(to right,#fff 30%,#fff0),
linear-gradient(to left,#fff 30%,#fff0) 100% 0,linear-gradient(to right,#0002,#0000),
linear-gradient(to left,#0002,#0000) 100% 0;background-repeat:no-repeat;background-size:2em 100%,2em 100%,.8em 100%,
.8em 100%;background-attachment:local,local,scroll,scroll}
th{white-space:normal;vertical-align:bottom}
.answers{font-size:1.05em;margin:1em 0}.answers p{margin:.6em 0}.phone{display:none}
@media (max-width:600px){.phone{display:block}}
table{border-collapse:collapse;font-size:.85em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right}th{background:#f3f3f3}
table.sortable th{cursor:pointer}table.sortable th:hover{background:#e4e4e4}
td:first-child,th:first-child{text-align:left}figure{margin:1em 0}img{max-width:100%;height:auto}
figcaption{font-size:.85em;color:#555}.note{color:#8a4b00}
pre{overflow-x:auto;background:#f6f6f6;padding:.6em;font-size:.85em;white-space:pre-wrap;overflow-wrap:anywhere}
details.fold{margin:.8em 0}details.fold>summary{font-weight:600}
@media (max-width:600px){.wide-figure img{max-width:none;width:var(--readable)}}
.findings{background:#eef5fb;border-left:4px solid #0072B2;padding:.4em 1em;margin:1em 0}
.findings ul{padding-left:1.2em}.findings li{margin:.3em 0}nav ol{columns:2 16em;font-size:.9em}
details summary{cursor:pointer}details summary h2{display:inline}
.maps{display:flex;flex-wrap:wrap;gap:.8em;overflow-x:auto}.maps figure{flex:0 1 240px;margin:0}
.maps svg{width:100%;height:auto;display:block}.maps rect:hover{stroke:#000;stroke-width:1}"""

SORT_JS = """document.querySelectorAll("table.sortable").forEach(function(t){
t.querySelectorAll("thead th").forEach(function(th,i){th.title="click to sort";th.addEventListener("click",function(){
var up=th.dataset.dir!=="up";th.dataset.dir=up?"up":"down";var body=t.tBodies[0];
var key=function(r){var s=r.cells[i].textContent.trim(),n=parseFloat(s.replace(/,/g,""));return isNaN(n)?s:n;};
Array.from(body.rows).sort(function(a,b){var x=key(a),y=key(b),c=typeof x===typeof y?(x<y?-1:x>y?1:0):
(typeof x==="number"?-1:1);return up?c:-c;}).forEach(function(r){body.appendChild(r);});});});});"""


def _html_table(df: pd.DataFrame, phone: bool = False) -> str:
    """A sortable table in a box that scrolls sideways (a shadow at an edge with more columns behind it); column
    headers may wrap after an underscore, so a long name does not widen its column."""
    table = format_table(df).to_html(index=False, border=0, classes="sortable")
    table = re.sub(r"<th>([^<]*)</th>", lambda m: "<th>" + m.group(1).replace("_", "_<wbr>") + "</th>", table)
    return f'<div class="scroll{" phone" if phone else ""}">\n{table}\n</div>'


def _text_attributes(png: bytes, prefix: str = "") -> str:
    """``data-[phone-]smallest-pt``, ``data-[phone-]dpi`` and ``data-[phone-]width`` (px) of a figure's PNG, from
    which a browser computes the height of its smallest text where it is shown (:func:`.plots.common.text_scale`)."""
    record = text_scale(png)
    if record is None:
        return ""
    with Image.open(io.BytesIO(png)) as image:
        width = image.width
    return (f' data-{prefix}smallest-pt="{record["smallest_pt"]:g}" data-{prefix}dpi="{record["dpi"]:g}"'
            f' data-{prefix}width="{width}"')


def readable_width(png: bytes) -> int | None:
    """The width (CSS px) at which the smallest text of ``png`` is MIN_TEXT_PX tall, or None when unknown."""
    record = text_scale(png)
    if record is None:
        return None
    with Image.open(io.BytesIO(png)) as image:
        width = image.width
    return math.ceil(MIN_TEXT_PX * width / (record["smallest_pt"] / 72 * record["dpi"])) + 2  # +2: rounding


def _html_picture(block: Picture) -> str:
    """The PNG, or on screens up to 600 px its phone version where it has one (``<picture>``, data: URIs). A
    figure without one whose text would be under MIN_TEXT_PX on a phone keeps a width that holds its text at that
    size there, in a box that scrolls sideways."""
    e = html.escape
    uri = "data:image/png;base64," + base64.b64encode(block.png).decode("ascii")
    img = f'<img src="{uri}" alt="{e(block.name)}"{_text_attributes(block.png)}>'
    caption = f"<figcaption>{e(block.name)}: {e(block.caption)}</figcaption>"
    if block.phone_png is not None:
        small = "data:image/png;base64," + base64.b64encode(block.phone_png).decode("ascii")
        img = img.replace("<img ", f"<img{_text_attributes(block.phone_png, 'phone-')} ", 1)
        img = f'<picture><source media="(max-width: 600px)" srcset="{small}">{img}</picture>'
        return f"<figure>{img}{caption}</figure>"
    need = readable_width(block.png)
    if need is not None and need > PHONE_CONTENT_PX:
        img = img.replace("<img ", f'<img style="--readable:{need}px" ', 1)
        return f'<figure><div class="scroll wide-figure">{img}</div>{caption}</figure>'
    return f"<figure>{img}{caption}</figure>"


def _html_block(block: Block) -> str:
    e = html.escape
    if isinstance(block, Answers):
        items = "\n".join(f"<p><b>{e(q)}</b> {e(a)}</p>" for q, a in block.items)
        return f'<div class="answers">\n{items}\n</div>'
    if isinstance(block, Findings):
        items = "\n".join(f"<li>{e(s)}</li>" for s in block.sentences)
        return f'<div class="findings"><ul>\n{items}\n</ul></div>'
    if isinstance(block, Facts):
        return ("<ul>\n" + "\n".join(f"<li><b>{e(label)}</b>: {e(value)}</li>" for label, value in block.items)
                + "\n</ul>")
    if isinstance(block, Note):
        return f'<p class="note">Note: {e(block.text)}</p>'
    if isinstance(block, Table):
        return _html_table(block.df, block.phone)
    if isinstance(block, Paragraph):
        return f"<p>{e(block.text)}</p>"
    if isinstance(block, Fold):
        inner = "\n".join(_html_block(b) for b in block.blocks)
        return f"<details class=\"fold\"><summary>{e(block.title)}</summary>\n{inner}\n</details>"
    if isinstance(block, Commands):
        return "<pre><code>" + "\n".join(e(line) for line in block.lines) + "</code></pre>"
    assert isinstance(block, Picture)
    if block.svg is not None:  # inline markup (hover values) instead of the PNG
        return (f'<figure><div class="maps">{block.svg}</div><figcaption>{e(block.name)}: {e(block.caption)}'
                "</figcaption></figure>")
    return _html_picture(block)


def _section(i: int, sec: Section) -> list[str]:
    title = html.escape(sec.title)
    body = [_html_block(block) for block in sec.blocks]
    if sec.collapsed:
        return [f'<details id="s{i}"><summary><h2>{title}</h2></summary>', *body, "</details>"]
    return [f'<section id="s{i}">', f"<h2>{title}</h2>", *body, "</section>"]


def render_html(secs: list[Section]) -> str:
    toc = "\n".join(f'<li><a href="#s{i}">{html.escape(sec.title)}</a></li>' for i, sec in enumerate(secs)
                    if not sec.lead)
    body = ["<h1>headprune report</h1>"]
    for i, sec in enumerate(secs):  # the first screen before the table of contents
        body += _section(i, sec) if sec.lead else []
    body.append(f'<nav aria-label="contents"><ol>\n{toc}\n</ol></nav>')
    for i, sec in enumerate(secs):
        body += [] if sec.lead else _section(i, sec)
    head = ('<meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>headprune report</title><style>{CSS}</style>")
    page = "\n".join(body)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n<body>\n{page}\n<script>{SORT_JS}</script>\n'
            "</body>\n</html>\n")
