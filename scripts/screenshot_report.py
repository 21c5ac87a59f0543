"""Look at a report.html in headless Chromium: measure it at given widths, or save screenshots.

    python scripts/screenshot_report.py reports/stdlib-gpt2-mini/report.html --out reports/screenshots

writes ``report-1400px.png`` and ``report-400px.png`` (the whole page, up to --max-height pixels) and
``report-first-screen.png`` (the first width, --first-screen pixels tall: what opens on a laptop) and prints,
per width, what :func:`measure` finds: the page width against the viewport, broken images, tables whose box
reaches past the page, and whether clicking a table header sorted it.

Chromium's headless window is at least 500 px wide, so the page is loaded into an iframe of exactly the
width asked for (same-origin ``file://``, hence ``--allow-file-access-from-files``) and the screenshot is
cropped to it. Needs ``chromium`` (or ``chromium-browser``, ``google-chrome``) on PATH; nothing else.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files",
         "--disable-dev-shm-usage", "--run-all-compositor-stages-before-draw", "--virtual-time-budget=20000"]

# Runs in the outer page once every iframe has loaded; writes one JSON object into <pre id="out">.
PROBE_JS = """
window.addEventListener("load", function () {
  var out = {};
  document.querySelectorAll("iframe").forEach(function (f) {
    var w = f.contentWindow, d = f.contentDocument, r = {};
    r.viewport = w.innerWidth;
    r.page_width = d.documentElement.scrollWidth;
    r.height = d.documentElement.scrollHeight;
    r.images = d.images.length;
    r.broken_images = Array.from(d.images).filter(function (i) { return !i.complete || i.naturalWidth === 0; })
      .map(function (i) { return i.alt; });
    r.tables = d.querySelectorAll("table").length;
    r.closed_sections = d.querySelectorAll("details:not([open])").length;
    var first = d.images[0];  // the first figure as the page opens: is it on the first screen?
    r.first_image = first ? {alt: first.alt, top: first.getBoundingClientRect().top,
                             bottom: first.getBoundingClientRect().bottom} : null;
    d.querySelectorAll("details").forEach(function (x) { x.open = true; });  // the rest is measured unfolded
    r.open_height = d.documentElement.scrollHeight;
    r.open_page_width = d.documentElement.scrollWidth;
    function scroller(el) {  // the nearest box (the element or above it) that scrolls sideways
      while (el && el !== d.body) {
        if (["auto", "scroll"].indexOf(w.getComputedStyle(el).overflowX) >= 0) { return el; }
        el = el.parentElement;
      }
      return null;
    }
    r.tables_past_page = Array.from(d.querySelectorAll("table")).filter(function (t) {
      var box = (scroller(t) || t).getBoundingClientRect();  // a wide table scrolls inside its own box
      return box.right > w.innerWidth + 1 || box.left < -1;
    }).length;
    // a code block must show every character without scrolling: it wraps, and stays inside the page
    r.code_cut = Array.from(d.querySelectorAll("pre")).filter(function (p) {
      return p.scrollWidth > p.clientWidth + 1 || p.getBoundingClientRect().right > w.innerWidth + 1;
    }).map(function (p) { return p.textContent.slice(0, 60); });
    var cut = Array.from(d.querySelectorAll("table")).filter(function (t) {
      return t.getBoundingClientRect().width > t.parentElement.clientWidth + 1;  // needs sideways scrolling
    });
    r.tables_cut = cut.length;
    r.phone_pictures = Array.from(d.querySelectorAll("picture img")).filter(function (i) {
      return i.currentSrc !== i.src; }).length;  // <picture> images showing their <source> (the phone version)
    r.cut_columns = cut.map(function (t) { return Array.from(t.rows[0].cells).map(function (c) {
      return c.textContent; }).join(","); });
    // the smallest text of each PNG figure in CSS px: the font (pt) and dpi it was drawn with (data-
    // attributes of the version shown), scaled by the width it is shown at over its natural width
    r.figure_text = Array.from(d.images).map(function (i) {
      var phone = i.currentSrc !== i.src, ds = i.dataset;
      var pt = parseFloat(phone ? ds.phoneSmallestPt : ds.smallestPt), dpi = parseFloat(phone ? ds.phoneDpi : ds.dpi);
      var px = pt / 72 * dpi * i.getBoundingClientRect().width / i.naturalWidth;
      return {alt: i.alt, phone: phone, px: isNaN(px) ? null : Math.round(px * 100) / 100,
              shown: Math.round(i.getBoundingClientRect().width), natural: i.naturalWidth};
    });
    // inline SVG text (the heatmaps): its font size times the scale the SVG is drawn at
    r.svg_text_px = Array.from(d.querySelectorAll("svg text")).reduce(function (lo, t) {
      var px = parseFloat(w.getComputedStyle(t).fontSize) * t.getScreenCTM().a;
      return Math.min(lo, px);
    }, 1e9);
    var t = Array.from(d.querySelectorAll("table.sortable")).find(function (t) {
      return t.tBodies[0].rows.length > 2;
    });
    if (t) {
      var i = t.tHead.rows[0].cells.length - 1;
      t.tHead.rows[0].cells[i].click();
      var v = Array.from(t.tBodies[0].rows).map(function (r) { return parseFloat(r.cells[i].textContent); });
      r.sorted = v.every(function (x, k) { return k === 0 || isNaN(x) || isNaN(v[k - 1]) || v[k - 1] <= x; });
    }
    out[f.dataset.width] = r;
  });
  document.getElementById("out").textContent = JSON.stringify(out);
});
"""


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def _frames_page(report: Path, widths: list[int], height: int, probe: bool) -> str:
    src = html.escape(report.resolve().as_uri())
    frames = "".join(f'<iframe data-width="{w}" src="{src}" style="width:{w}px;height:{height}px;border:0;'
                     'display:block"></iframe>' for w in widths)
    script = f"<script>{PROBE_JS}</script>" if probe else ""
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">{frames}'
            f'<pre id="out"></pre>{script}</body></html>')


def _chromium(browser: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([browser, *FLAGS, *args], capture_output=True, text=True, timeout=timeout, check=False)


def measure(report: str | Path, widths: list[int], browser: str | None = None, timeout: float = 120) -> dict:
    """{width: {viewport, page_width, height, images, broken_images, tables, tables_past_page, tables_cut,
    sorted, ...}}, measured as the page opens (height: folded sections closed) and then with every ``<details>``
    open: tables_cut, tables wider than their box (readable only by scrolling sideways); code_cut, code blocks
    that hide characters; figure_text, the smallest text of each PNG in CSS px; svg_text_px, the smallest text
    of the inline SVG maps."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(f"no headless browser found ({', '.join(BROWSERS)})")
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.html"
        probe.write_text(_frames_page(Path(report), widths, 900, probe=True))
        done = _chromium(browser, [f"--window-size={max(widths) + 100},1000", "--dump-dom", probe.as_uri()], timeout)
    found = re.search(r'<pre id="out">(.*?)</pre>', done.stdout, re.DOTALL)
    if done.returncode != 0 or not found or not found.group(1).strip():
        raise RuntimeError(f"chromium measured nothing (exit {done.returncode}): {done.stderr[-1500:]}")
    return {int(k): v for k, v in json.loads(html.unescape(found.group(1))).items()}


def screenshot(report: str | Path, width: int, out_png: str | Path, height: int, browser: str | None = None,
               timeout: float = 180) -> Path:
    """The page at ``width`` px, ``height`` px tall from its top, as a PNG cropped to ``width``."""
    from PIL import Image  # matplotlib's dependency

    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(f"no headless browser found ({', '.join(BROWSERS)})")
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "frame.html"
        page.write_text(_frames_page(Path(report), [width], height, probe=False))
        raw = Path(tmp) / "raw.png"
        done = _chromium(browser, [f"--window-size={max(width, 500)},{height}", f"--screenshot={raw}",
                                   page.as_uri()], timeout)
        if done.returncode != 0 or not raw.is_file():
            raise RuntimeError(f"chromium took no screenshot (exit {done.returncode}): {done.stderr[-1500:]}")
        with Image.open(raw) as image:
            image.crop((0, 0, width, min(height, image.height))).save(out_png)
    return out_png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="path of report.html")
    p.add_argument("--widths", default="1400,400", help="comma-separated page widths in px (default: 1400,400)")
    p.add_argument("--out", help="folder for report-{width}px.png (default: only measure)")
    p.add_argument("--max-height", type=int, default=12000, help="screenshot height cap in px (default: 12000)")
    p.add_argument("--first-screen", type=int, default=900,
                   help="height in px of report-first-screen.png, at the first width (default: 900; 0: none)")
    args = p.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    found = measure(args.report, widths)
    print(json.dumps(found, indent=1))
    if args.out:
        for w in widths:
            print(screenshot(args.report, w, Path(args.out) / f"report-{w}px.png", min(found[w]["height"],
                                                                                         args.max_height)))
        if args.first_screen:
            print(screenshot(args.report, widths[0], Path(args.out) / "report-first-screen.png", args.first_screen))
    bad = any(r["broken_images"] or r["tables_past_page"] or r["code_cut"] or r["page_width"] > r["viewport"]
              for r in found.values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
