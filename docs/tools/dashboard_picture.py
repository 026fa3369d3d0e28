"""Remakes docs/dashboard.png: the dashboard of a two-policy run in which both policies train.

Starts ``python -m astraflow workflow=solve_verify`` (a solver and a verifier on the
default tiny model and task, ``raas=hf``, each policy with its own trainer) for
``--steps`` steps. The verifier trains only on groups it judged both right and wrong, so
it steps more slowly than the solver; the picture is taken once the leading policy has
trained ``--at`` steps (default: ten before the end, while its trainer still runs) and
every policy at least ``--min-steps``. Headless Chromium photographs ``/dashboard``
through the run's token link; the run is then stopped (SIGTERM, which ends it as
Ctrl-C does) and
each policy's batch-mean reward over its first and last ten steps is printed, so the
picture can be checked against the numbers.

    OMP_NUM_THREADS=1 python docs/tools/dashboard_picture.py --steps 150

Extra arguments are overrides for the run (``seed=1``, ``raas.concurrency=...``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--hide-scrollbars"]


def train_records(run_dir: Path) -> list[dict]:
    """Every train record so far: each trainer's stream under metrics/ while the run goes on."""
    out = []
    for path in sorted((run_dir / "metrics").glob("train-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line still being written
                continue
            if record.get("kind") == "train":
                out.append(record)
    return out


def steps_by_policy(records: list[dict]) -> dict[str, int]:
    steps: dict[str, int] = {}
    for r in records:
        steps[r["policy"]] = max(steps.get(r["policy"], 0), r["step"])
    return steps


def wait(condition, timeout: float, what: str, launcher: subprocess.Popen):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (value := condition()):
            return value
        if launcher.poll() is not None:
            raise SystemExit(f"the run ended (exit {launcher.returncode}) before {what}")
        time.sleep(1)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def screenshot(url: str, token: str, out: Path, chromium: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,1150",
             "--virtual-time-budget=15000", f"--screenshot={out}",
             f"{url}/dashboard#token={token}"],
            check=True, capture_output=True, timeout=120)
    if not out.exists():
        raise SystemExit(f"Chromium wrote no picture of {url}/dashboard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--at", type=int, default=0,
                        help="photograph once a policy trained this many steps "
                             "(default: --steps minus 10)")
    parser.add_argument("--min-steps", type=int, default=20,
                        help="... and every policy at least this many")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "dashboard-picture")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args, overrides = parser.parse_known_args()
    at = args.at or max(args.steps - 10, 1)

    token = secrets.token_urlsafe(18)
    if args.run_dir.exists():
        shutil.rmtree(args.run_dir)
    args.run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = args.run_dir.with_suffix(".log")
    env = dict(os.environ, ASTRAFLOW_TOKEN=token, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "astraflow", f"run_dir={args.run_dir}",
           "workflow=solve_verify", f"steps={args.steps}", "launcher.progress=false", *overrides]
    print(" ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    with log.open("w") as log_file:
        launcher = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                    cwd=ROOT)
        try:
            url_file = args.run_dir / "url"
            url = wait(lambda: url_file.exists() and url_file.read_text().strip(), 600,
                       "the data layer's URL", launcher)

            def trained() -> bool:
                steps = steps_by_policy(train_records(args.run_dir))
                return (len(steps) >= 2 and max(steps.values()) >= at
                        and min(steps.values()) >= args.min_steps)

            wait(trained, 6 * 3600, f"a policy at step {at} (log: {log})", launcher)
            tmp = args.out.with_suffix(".new.png")
            screenshot(url, token, tmp, args.chromium)
            tmp.replace(args.out)
            print(f"{args.out}: photographed at {time.monotonic() - t0:.0f} s, steps "
                  f"{steps_by_policy(train_records(args.run_dir))}", flush=True)
        finally:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGTERM)
                try:
                    launcher.wait(timeout=180)
                except subprocess.TimeoutExpired:
                    launcher.kill()
                    launcher.wait()
    records = train_records(args.run_dir)
    for policy in sorted(steps_by_policy(records)):
        rewards = [r["reward_mean"] for r in sorted(records, key=lambda r: r["step"])
                   if r["policy"] == policy]
        first, last = rewards[:10], rewards[-10:]
        print(f"{policy}: {len(rewards)} steps, batch-mean reward "
              f"{sum(first) / len(first):.3f} (first 10) -> {sum(last) / len(last):.3f} (last 10)")
    print(f"run: {args.run_dir} ({time.monotonic() - t0:.0f} s, exit {launcher.returncode})")


if __name__ == "__main__":
    main()
