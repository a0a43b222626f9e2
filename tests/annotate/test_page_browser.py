"""The labelling page in a real browser: Debian's Chromium driven by Playwright. An annotator labels
by keyboard, reloads half-way and goes on where they stopped, takes an answer back; every answer
is in the database, and the page loads nothing from outside the server. Skipped only where no
Chromium is installed (`.ci/run` installs Debian's).

The screenshot (docs/img/annotate-page.png) was checked by eye; regenerate it with
`python tests/annotate/test_page_browser.py docs/img/annotate-page.png`."""

from __future__ import annotations

import re
import shutil

import pytest

from pipelines.annotate import server as S
from pipelines.annotate.store import AnswerStore
from pipelines.annotate.tasks import ANSWERS_DB
from schemas import annotation as A

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


class Served:
    def __init__(self, tasks):
        from werkzeug.serving import make_server

        self.server = make_server("127.0.0.1", 0, S.create_app(tasks), threaded=True)
        self.base = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self):
        from helpers import serve_in_thread

        serve_in_thread(self.server)
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def browse(base, steps, screenshot=None):
    from playwright.sync_api import sync_playwright

    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.set_default_timeout(60_000)              # a busy 2-core machine: never a timing assertion
            page.on("request", lambda r: requests.append(r.url))
            steps(page)
            if screenshot:
                page.screenshot(path=screenshot)
        finally:
            browser.close()
    return requests


def test_an_annotator_labels_by_keyboard_reloads_and_undoes(tasks):
    from playwright.sync_api import expect

    expect.set_options(timeout=60_000)
    order = S.order(tasks, "alice")
    answers = ["yes", "no", "unsure", "yes"]
    seen = []

    def steps(page):
        page.goto(f"{base}/a/alice")
        for k, answer in enumerate(answers):
            expect(page.locator("#count")).to_have_text(re.compile(f"^{k} / "))   # the answer before is in
            if k == 2:                                  # half-way: reload, resume at the first unanswered item
                page.reload()
                expect(page.locator("#count")).to_have_text(re.compile(f"^{k} / "))
            seen.append(page.get_attribute("#img", "data-item"))
            expect(page.locator("#img")).to_have_js_property("complete", True)
            assert page.evaluate("document.getElementById('img').naturalWidth") > 0
            page.keyboard.press(str(["yes", "no", "unsure"].index(answer) + 1))
        expect(page.locator("#count")).to_have_text(re.compile(f"^{len(answers)} / "))
        page.keyboard.press("u")                        # take the last answer back
        expect(page.locator("#note")).to_have_text("last answer taken back")
        assert page.get_attribute("#img", "data-item") == order[len(answers) - 1]

    with Served(tasks) as served:
        base = served.base
        requests = browse(base, steps)
    assert seen == order[:len(answers)]
    got = AnswerStore(tasks.path / ANSWERS_DB).labels().set_index(A.ITEM_ID)[A.ANSWER].to_dict()
    assert got == dict(zip(order[:len(answers) - 1], answers[:-1]))
    assert requests and all(u.startswith(base + "/") for u in requests)


if __name__ == "__main__":      # the screenshot in docs/img: a small task set of hand-made images
    import sys
    import tempfile
    from pathlib import Path

    import numpy as np
    import pandas as pd
    from PIL import Image

    from pipelines.annotate import plan as PL
    from pipelines.annotate.tasks import TaskSet
    from pipelines.engine.storage.checkpoint import model_dir

    tmp = Path(tempfile.mkdtemp())
    run = tmp / "run"
    rows = []
    for k in range(6):
        rows.append({"model": "org/model", "image_id": f"i{k}", "detection_status": "ok",
                     "prompt_nouns": ["doctor", "desk"], "hidden_nouns": ["desk"]})
        f = run / "images" / model_dir("org/model") / f"i{k}.png"
        f.parent.mkdir(parents=True, exist_ok=True)
        yy, xx = np.mgrid[0:384, 0:384]
        Image.fromarray(np.stack([xx % 256, yy % 256, (xx + yy + 40 * k) % 256], -1).astype(np.uint8)).save(f)
    pd.DataFrame(rows).to_parquet(run / "images.parquet")
    (run / "run.json").write_text('{"run_id": "demo", "status": "finished"}')
    (run / "metrics.json").write_text('{"run_id": "demo", "study": "paper004-exposed"}')
    ts = TaskSet.load(PL.plan(run, "exposed-nouns", tmp / "tasks", n=6))
    with Served(ts) as served:
        from playwright.sync_api import expect

        def first_answer(page):
            page.goto(f"{served.base}/a/alice")
            expect(page.locator("#count")).to_have_text(re.compile("^0 / "))
            page.keyboard.press("1")
            expect(page.locator("#count")).to_have_text(re.compile("^1 / "))

        browse(served.base, first_answer, screenshot=sys.argv[1])
