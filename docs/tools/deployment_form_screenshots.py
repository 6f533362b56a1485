"""Screenshots of a deployment launched from the Prefect UI form with a preset (docs/prefect-deployment-preset-*.png).

Drives the real UI of a running stack (``searchloop up``) with headless Chromium through Playwright: opens the
``build-index/default`` run form, picks ``index_mini_dense`` in the preset drop-down, adds three overrides, submits,
waits for the run to finish and shows its Parameters tab. Playwright is not a searchloop dependency: run this from its
own virtualenv with the system Chromium (``apt-get install chromium``; ``pip install playwright==1.49.1``):

    <playwright venv>/bin/python docs/tools/deployment_form_screenshots.py --ui http://127.0.0.1:4200 --out docs
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

OVERRIDES = ["index.limit=300", "index.shard_size=150", "name=ui-form-dense"]


def _get(url: str, body: dict | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def main() -> None:
    """Take the three screenshots."""
    from playwright.sync_api import sync_playwright

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ui", default="http://127.0.0.1:4200", help="Prefect UI URL of the stack.")
    p.add_argument("--out", type=Path, default=Path("docs"), help="Where the PNG files go.")
    p.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium executable.")
    args = p.parse_args()
    api = f"{args.ui}/api"
    dep = _get(f"{api}/deployments/name/build-index/default")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{args.ui}/deployments/deployment/{dep['id']}/run", wait_until="networkidle", timeout=120_000)
        page.wait_for_timeout(2000)
        select = page.locator("button.p-select-button__control").first
        select.click()
        select.press("ArrowDown")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(args.out / "prefect-deployment-preset-dropdown.png"))
        page.get_by_role("option", name="index_mini_dense", exact=True).click()
        for text in OVERRIDES:
            page.get_by_role("button", name="Add item").click()
            page.wait_for_timeout(500)
            page.locator("textarea.p-textarea__control").last.fill(text)
        page.screenshot(path=str(args.out / "prefect-deployment-preset-form.png"), full_page=True)
        page.get_by_role("button", name="Submit").click()
        page.wait_for_timeout(3000)
        runs = _get(f"{api}/flow_runs/filter", {"limit": 1, "sort": "EXPECTED_START_TIME_DESC",
                                                 "deployments": {"id": {"any_": [dep["id"]]}}})
        run_id = runs[0]["id"]  # type: ignore[index]
        while _get(f"{api}/flow_runs/{run_id}")["state_type"] not in {"COMPLETED", "FAILED", "CRASHED"}:  # type: ignore[index]
            time.sleep(5)
        page.goto(f"{args.ui}/runs/flow-run/{run_id}", wait_until="networkidle", timeout=120_000)
        page.wait_for_timeout(3000)
        page.get_by_role("tab", name="Parameters").first.click()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(args.out / "prefect-deployment-preset-run.png"))
        browser.close()


if __name__ == "__main__":
    main()
