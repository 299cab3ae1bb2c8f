"""Drives headless Chromium through chromedriver's WebDriver HTTP protocol
(urllib only) against meshrun's status page during a real run:

  1. open the page; wait until the run shows both nodes as participants and
     0 restarts;
  2. create FAIL_FILE (the test's workers fail on it); wait until the page
     shows 1 restart, round 2 and the last failure with its traceback;
  3. save a screenshot.

Prints one line per step; exits 0 when every check passed, 1 otherwise.
chromedriver (and the Chromium it starts) is ended by its pid.
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

STATE_JS = """
const runs = [...document.querySelectorAll('[data-run]')].map(r => ({
  id: r.dataset.run,
  restarts: (r.querySelector('[data-field="restart-count"]') || {}).textContent,
  round: (r.querySelector('[data-field="round"]') || {}).textContent,
  nodes: [...r.querySelectorAll('tr[data-node]')].map(
      tr => [...tr.children].map(td => td.textContent)),
  failure: (r.querySelector('[data-field="last-failure"]') || {}).textContent || ''
}));
return {runs: runs, updated: document.getElementById('updated').textContent,
        version: document.getElementById('version').textContent};
"""


class WebDriver:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        self.session = None

    def call(self, method, path, body=None, timeout=30):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"{}").get("value")

    def start(self, user_data_dir, width, height):
        value = self.call(
            "POST",
            "/session",
            {
                "capabilities": {
                    "alwaysMatch": {
                        "browserName": "chrome",
                        "goog:chromeOptions": {
                            "binary": "/usr/bin/chromium",
                            "args": [
                                "--headless=new",
                                "--no-sandbox",
                                "--disable-gpu",
                                "--disable-dev-shm-usage",
                                "--no-first-run",
                                f"--user-data-dir={user_data_dir}",
                                f"--window-size={width},{height}",
                            ],
                        },
                    }
                }
            },
            timeout=60,
        )
        self.session = value["sessionId"]

    def s(self, path):
        return f"/session/{self.session}{path}"

    def open(self, url):
        self.call("POST", self.s("/url"), {"url": url})

    def script(self, source):
        return self.call("POST", self.s("/execute/sync"), {"script": source, "args": []})

    def screenshot(self, path):
        with open(path, "wb") as out:
            out.write(base64.b64decode(self.call("GET", self.s("/screenshot"))))

    def quit(self):
        if self.session:
            try:
                self.call("DELETE", self.s(""), timeout=10)
            except OSError:
                pass


def start_chromedriver():
    process = subprocess.Popen(
        ["/usr/bin/chromedriver", "--port=0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if "started successfully on port" in line:
            port = int(line.rsplit(" ", 1)[1].strip().rstrip("."))
            return process, port
    raise RuntimeError("chromedriver did not report its port")


def stop(process):
    """chromedriver leads its own session: its group holds the Chromium it started."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass
    # Chromium's own helpers may outlive chromedriver in its group.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(driver, what, check, timeout):
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = driver.script(STATE_JS)
        if check(state):
            print(f"ok: {what}", flush=True)
            return state
        time.sleep(0.2)
    print(f"FAILED: {what}; the page shows {json.dumps(state)}", flush=True)
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--fail-file", required=True)
    parser.add_argument("--screenshot", required=True)
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()

    def run_of(state):
        return next((r for r in state["runs"] if r["id"] == args.run_id), None)

    def participants(run):
        return [n for n in run["nodes"] if n[2] == "participant"]

    user_data_dir = tempfile.mkdtemp(prefix="meshrun-chromium-")
    process, port = start_chromedriver()
    driver = WebDriver(port)
    ok = False
    try:
        driver.start(user_data_dir, 1280, 860)
        driver.open(args.url)
        before = wait_for(
            driver,
            "both nodes are participants, 0 restarts",
            lambda s: (
                (r := run_of(s)) is not None
                and len(participants(r)) == 2
                and r["restarts"] == "0 / 1"
                and r["round"] == "1"
            ),
            args.timeout,
        )
        if before:
            ranks = sorted(n[4] for n in participants(run_of(before)))
            print(f"ok: global ranks shown {ranks}", flush=True)
            # The daemon's build in the header: "0.1.0 (commit 0123456789ab)".
            version_ok = (
                re.fullmatch(r"\d+\.\d+\.\d+ \(commit [0-9a-z-]+\)", before["version"]) is not None
            )
            print(
                f"{'ok' if version_ok else 'FAIL'}: daemon build shown '{before['version']}'",
                flush=True,
            )
            with open(args.fail_file, "w") as f:
                f.write("fail\n")
            after = wait_for(
                driver,
                "1 restart, round 2, last failure with its traceback",
                lambda s: (
                    (r := run_of(s)) is not None
                    and r["restarts"] == "1 / 1"
                    and r["round"] == "2"
                    and len(participants(r)) == 2
                    and "exit 1" in r["failure"]
                    and "corrupt batch at step 17" in r["failure"]
                    and "load_batch" in r["failure"]
                ),
                args.timeout,
            )
            if after:
                # Let the heartbeat ages tick once more, so the picture is live.
                time.sleep(1.2)
                driver.screenshot(args.screenshot)
                print(
                    f"ok: screenshot {args.screenshot} ({os.path.getsize(args.screenshot)} bytes)",
                    flush=True,
                )
                ok = ranks == ["0 - 1", "2 - 3"] and version_ok
                if not ok:
                    print(f"FAILED: ranks {ranks}", flush=True)
    finally:
        driver.quit()
        stop(process)
        shutil.rmtree(user_data_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
