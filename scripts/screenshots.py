"""Full-page screenshots of the studies' report.html pages with headless Chromium, at 1400 px.

One command, from the repository root:

    .venv/bin/python scripts/screenshots.py RUN_DIR [RUN_DIR ...]        # existing runs
    .venv/bin/python scripts/screenshots.py --run-demos                   # every study's stand-in demo
    .venv/bin/python scripts/screenshots.py --run-demos gep exposed       # some of them

A RUN_DIR is a run directory (``<output>/<run id>/``, holding report.html), a report.html file, or
any folder above runs (every report.html under it is taken, ``_work/`` skipped); name them before
``--run-demos``. ``--run-demos`` runs each named study's README stand-in command (tiny random-weight
models; all six take some ten to fifteen minutes on two cores, amplification the longest) into a
temporary directory (``--workdir DIR`` to keep the runs) and takes their reports. Studies:
amplification, gep, dalleval, dalleval-skills, dalleval-alignment, exposed.

Each page is written to ``--out`` (default ``screenshots/``, git-ignored) as ``<run id>.png``
(``<study>-<run id>.png`` for the demos), the whole page at ``--width`` CSS px (default 1400). For
each page the script also prints a layout check: the page's width against the window's (a page
that scrolls sideways fails it), images that did not load, and the elements that stick out. The
exit status is 1 when a check failed or a page could not be taken, 2 when no Chromium is found
(``chromium``, ``chromium-browser``, ``google-chrome``; or set ``CHROMIUM``).

The browser runs as ``chromium --headless --no-sandbox --disable-gpu``: first ``--dump-dom`` on a
copy of the page with a small script that writes its measurements into the DOM, then
``--screenshot`` with the window as tall as the page. ``tests/engine/test_report_browser.py`` uses
``check_page`` from here.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1400, 1000
MAX_HEIGHT = 32000          # the tallest window Chromium is asked for; a longer page is cut there
TIMEOUT_S = 120

# written into the page copy: measured once the page (and every image) has loaded
_PROBE = """<script>window.addEventListener('load', function () {
  var d = document.documentElement, w = window.innerWidth, imgs = [].slice.call(document.images);
  function clipped(e) { for (var p = e.parentElement; p && p !== document.body; p = p.parentElement) {
      var o = getComputedStyle(p).overflowX; if (o === 'auto' || o === 'scroll' || o === 'hidden') return true; }
    return false; }
  function name(e) { return e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
      (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : ''); }
  var wide = [];
  if (d.scrollWidth > w) { [].slice.call(document.body.querySelectorAll('*')).forEach(function (e) {
      var r = e.getBoundingClientRect(); if (r.right > w + 1 && !clipped(e) && wide.length < 8)
        wide.push(name(e) + ' ' + Math.round(r.right) + 'px'); }); }
  var r = {scrollWidth: d.scrollWidth, innerWidth: w, scrollHeight: Math.max(d.scrollHeight, document.body.scrollHeight),
           images: imgs.length, wide: wide,
           broken: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                       .map(function (i) { return (i.getAttribute('data-figure') || i.alt || i.src).slice(0, 80); })};
  var p = document.createElement('pre'); p.id = 'layout-check'; p.textContent = JSON.stringify(r);
  document.body.appendChild(p);
});</script>"""

DEMOS = {  # study -> the README's stand-in command (without --output)
    "amplification": ["pipelines/amplification.py", "run", "--standin-models", "--sample-size", "10", "--nn-k", "10",
                      "--images-per-prompt", "2", "--caption-images", "1", "--steps", "5"],
    "gep": ["pipelines/gep.py", "run", "--standin-models", "--images-per-prompt", "1", "--steps", "2",
            "--max-contexts", "2"],
    "dalleval": ["pipelines/dalleval.py", "run", "--standin-models", "--images-per-prompt", "1", "--steps", "2"],
    "dalleval-skills": ["pipelines/dalleval.py", "skills", "--standin-models", "--prompts-per-skill", "8",
                        "--steps", "2"],
    "dalleval-alignment": ["pipelines/dalleval.py", "alignment", "--standin-models", "--steps", "2"],
    "exposed": ["pipelines/exposed.py", "run", "--standin-models", "--max-triplets", "2", "--steps", "2"],
}


def find_chromium() -> str | None:
    """The Chromium (or Chrome) binary: ``$CHROMIUM``, else the first of the usual names on PATH."""
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _chromium(binary: str, args: list[str], profile: str, timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_page(page: str | Path, width: int = WIDTH, height: int = HEIGHT, binary: str | None = None) -> dict:
    """Load ``page`` (an HTML file) in headless Chromium at ``width`` x ``height`` and measure it:
    ``{"scrollWidth", "innerWidth", "scrollHeight", "images", "broken": [names of images that did not
    load], "wide": [elements sticking out of the window, outside any scrolling box]}``. The page is
    copied (with the measuring script) beside itself as ``.layout-check-*.html``, so relative
    references would still resolve, and removed afterwards."""
    binary = binary or find_chromium()
    if binary is None:
        raise FileNotFoundError("no chromium binary (chromium, chromium-browser, google-chrome; or set CHROMIUM)")
    page = Path(page).resolve()
    text = page.read_text(encoding="utf-8")
    probed = text.replace("</body>", _PROBE + "</body>") if "</body>" in text else text + _PROBE
    fd, copy = tempfile.mkstemp(prefix=".layout-check-", suffix=".html", dir=page.parent)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(probed)
            res = _chromium(binary, [f"--window-size={width},{height}", "--virtual-time-budget=5000", "--dump-dom",
                                     Path(copy).as_uri()], profile)
        finally:
            os.unlink(copy)
    m = re.search(r'<pre id="layout-check">(.*?)</pre>', res.stdout, flags=re.S)
    if m is None:
        raise RuntimeError(f"{page}: Chromium gave no measurement (exit {res.returncode}): {res.stderr[-2000:]}")
    return json.loads(html.unescape(m.group(1)))


def problems(check: dict) -> list[str]:
    """What is wrong with a measured page, as sentences ([] when nothing)."""
    out = []
    if check["scrollWidth"] > check["innerWidth"]:
        out.append(f"the page scrolls sideways: {check['scrollWidth']} px wide in a {check['innerWidth']} px window"
                   + (f" ({', '.join(check['wide'])})" if check.get("wide") else ""))
    if check["broken"]:
        out.append(f"{len(check['broken'])} of {check['images']} image(s) did not load: {', '.join(check['broken'][:5])}")
    return out


def screenshot(page: str | Path, out_png: str | Path, width: int = WIDTH, binary: str | None = None) -> dict:
    """A full-page PNG of ``page`` at ``width`` CSS px; returns ``check_page``'s measurement."""
    binary = binary or find_chromium()
    check = check_page(page, width, HEIGHT, binary)
    height = min(MAX_HEIGHT, max(HEIGHT, int(check["scrollHeight"])))
    out_png = Path(out_png).resolve()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        res = _chromium(binary, [f"--window-size={width},{height}", "--virtual-time-budget=5000",
                                 f"--screenshot={out_png}", Path(page).resolve().as_uri()], profile)
    if not out_png.is_file():
        raise RuntimeError(f"{page}: no screenshot (exit {res.returncode}): {res.stderr[-2000:]}")
    return check | {"height": height, "cut": check["scrollHeight"] > MAX_HEIGHT}


def reports(target: str | Path) -> list[Path]:
    """The report.html pages ``target`` names: itself (a file), its own report.html, or every
    report.html below it (checkpoint folders ``_work/`` skipped), sorted."""
    t = Path(target)
    if t.is_file():
        return [t]
    if (t / "report.html").is_file():
        return [t / "report.html"]
    return sorted(p for p in t.rglob("report.html") if "_work" not in p.parts)


def run_demos(studies: list[str], workdir: Path) -> list[tuple[str, Path]]:
    """Each study's stand-in demo into ``workdir/<study>/``: (study, its report.html) per run that
    wrote one; a failed demo is reported and skipped."""
    out = []
    for study in studies:
        dest = workdir / study
        cmd = [sys.executable, *DEMOS[study], "--output", str(dest), "--no-progress"]
        print(f"[{study}] {' '.join(cmd[1:])}", flush=True)
        log = workdir / f"{study}.log"
        with open(log, "w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
        found = reports(dest) if dest.exists() else []
        if rc != 0 or not found:
            print(f"[{study}] failed (exit {rc}); its output: {log}", flush=True)
            continue
        out += [(study, p) for p in found]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run directories, report.html files or folders holding runs")
    ap.add_argument("--run-demos", nargs="*", metavar="STUDY", choices=sorted(DEMOS), default=None,
                    help=f"run these studies' stand-in demos first (none named: all of {', '.join(DEMOS)})")
    ap.add_argument("--out", default="screenshots", help="where the PNGs go (default screenshots/)")
    ap.add_argument("--width", type=int, default=WIDTH, help=f"window width in CSS px (default {WIDTH})")
    ap.add_argument("--workdir", help="where --run-demos writes its runs (default: a temporary directory, removed)")
    args = ap.parse_args(argv)
    if not args.runs and args.run_demos is None:
        ap.error("name run directories, or --run-demos")
    binary = find_chromium()
    if binary is None:
        print("error: no chromium binary found (chromium, chromium-browser, google-chrome; or set CHROMIUM)",
              file=sys.stderr)
        return 2
    pages: list[tuple[str, Path]] = []
    for target in args.runs:
        found = reports(target)
        if not found:
            print(f"warning: no report.html in {target}", file=sys.stderr)
        pages += [(p.parent.name, p) for p in found]
    tmp = None
    try:
        if args.run_demos is not None:
            if args.workdir:
                work = Path(args.workdir)
                work.mkdir(parents=True, exist_ok=True)
            else:
                tmp = tempfile.TemporaryDirectory(prefix="t2i-demos-")
                work = Path(tmp.name)
            pages += [(f"{study}-{p.parent.name}", p) for study, p in run_demos(args.run_demos or list(DEMOS), work)]
        failed = args.run_demos is not None and len(pages) < len(args.runs) + len(args.run_demos or DEMOS)
        out, taken = Path(args.out), set()
        for name, page in pages:
            stem, i = name, 2
            while stem in taken:
                stem, i = f"{name}-{i}", i + 1
            taken.add(stem)
            try:
                check = screenshot(page, out / f"{stem}.png", args.width, binary)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
                print(f"{page}: FAILED: {exc}")
                failed = True
                continue
            bad = problems(check)
            failed |= bool(bad)
            print(f"{out / (stem + '.png')}: {args.width} x {check['height']} px"
                  f"{' (cut)' if check['cut'] else ''}, {check['images']} image(s); "
                  + ("; ".join(bad) if bad else "no sideways scroll, every image loaded") + f"  <- {page}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
