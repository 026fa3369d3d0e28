"""Chaos: a two-policy run under a seeded fault injector, beside the same run without.

Two runs of ``workflow=solve_verify`` start side by side from one command, with the same
seed and settings: two nodes of the launcher's (pool ``default``), a third node in a
network namespace of its own (pool ``far``, kept running by this script as a supervisor
would), the verifier's trainer on two ranks (``policies.verifier.world_size=2``) and an
evaluator per policy. In the *chaos* run a seeded driver, every ``--interval`` (20-60 s),
injects one fault, the kinds in a shuffled round so that each comes up:

* ``kill``: SIGKILL of the data layer, a node, a trainer, one rank of the verifier's
  trainer or an evaluator (with ``--agent``: ``workflow=agent``, one policy, and a node's
  agent worker process among the targets);
* ``stop``: SIGSTOP of one of those for 5-30 s, then SIGCONT (a hang, not a death);
* ``partition``: the far node's link drops every packet for 10-60 s (silently, as a
  network does: its requests time out).

When both runs are done it checks, and prints:

* each run completed its steps;
* the ledger of each policy: every trajectory the nodes got accepted is trained, still
  held, or dropped with its reason (filtered, too stale, no trainer) -- the data layer's
  counters, from its store; each trained batch is in exactly one step of the trainer's
  history (the trainer's records, the last of each step, since a restarted trainer trains
  again what it journalled), and those steps hold exactly the trajectories the data
  layer counts as trained: 0 trained twice, 0 acknowledged and lost;
* each policy's final held-out accuracy against the calm run's: within two standard
  errors (each a binomial error over the held-out tasks);
* every fault, and how long the run took to recover from it: from the fault's end (the
  kill, the SIGCONT, the healed link) until every policy trained another step.

Without root (no network namespace) the far node runs on loopback and no partition is
injected; the output says so.

    python bench/chaos.py [--minutes 10] [--seed 0] [--steps 500] [--batch-size 256]
Writes bench/results/chaos.json (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _farlink import FarLink
from _machine import cpu_model

from astraflow.testing.runs import alive, children, records, store_counts, unaccounted

RESULTS = Path(__file__).parent / "results" / "chaos.json"
TOKEN = "bench-chaos-token"
POLICIES = ("solver", "verifier")
KINDS = ("kill", "stop", "partition")
NODES = ("raas-0", "raas-1", "far-0")
COMPONENTS: tuple[str, ...] = ("dataflow", *NODES, *(f"trainer-{p}" for p in POLICIES),
                               *(f"eval-{p}" for p in POLICIES))
#: ``--agent``: the agent of examples/agent in two worker processes a node
AGENT = Path(__file__).resolve().parents[1] / "examples" / "agent" / "answer_agent.py"


def agent_shape() -> list[str]:
    """The ``workflow=agent`` variant: one policy, the agent workers of each node among
    the components (``agents@raas-0``: its worker processes, one of them hit)."""
    global POLICIES, COMPONENTS
    POLICIES = ("policy",)
    COMPONENTS = ("dataflow", *NODES, "trainer-policy", "eval-policy",
                  *(f"agents@{n}" for n in NODES))
    return ["workflow=agent", f"agent.path={AGENT}", "agent.workers=2"]


def agent_workers(pid: int) -> list[int]:
    """A node's agent worker processes."""
    out = []
    for child in children(pid):
        with contextlib.suppress(OSError):
            if b"astraflow.workflows.agent_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
    return sorted(out)


class Run:
    """One ``python -m astraflow`` run and its far node."""

    def __init__(self, name: str, root: Path, overrides: list[str], link: FarLink | None,
                 far_concurrency: int, steps: int) -> None:
        self.name, self.dir, self.link, self.steps = name, root / name, link, steps
        self.far_concurrency = far_concurrency
        self.far: subprocess.Popen | None = None
        self.far_starts = 0
        host = [f"dataflow.host={link.host_ip}"] if link else []
        self.env = dict(os.environ, ASTRAFLOW_TOKEN=TOKEN, OMP_NUM_THREADS="1")
        self.console = (root / f"{name}.console").open("w")
        self.launcher = subprocess.Popen(
            [sys.executable, "-m", "astraflow", f"run_dir={self.dir}",
             "launcher.progress=false", *host, *overrides],
            stdout=self.console, stderr=subprocess.STDOUT, env=self.env,
            # Ctrl-C stops it (finish()), even from a script started in the background
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.started = time.time()

    def url(self) -> str | None:
        path = self.dir / "store" / "url"
        return path.read_text().strip() or None if path.exists() else None

    def start_far(self) -> None:
        """The far node, started (again) as its machine's supervisor would."""
        url = self.url()
        assert url and (self.dir / "config.yaml").exists()
        cmd = [sys.executable, "-m", "astraflow", "raas", "--connect", url, "--config",
               str(self.dir / "config.yaml"), "--work-dir",
               str(self.dir.parent / f"{self.name}-far"),
               "--name", "far-0", "--pool", "far", "--region", "far",
               "--concurrency", str(self.far_concurrency)]
        log = (self.dir.parent / f"{self.name}-far.log").open("a")
        kw = {"env": self.env, "stdout": log, "stderr": subprocess.STDOUT}
        self.far = self.link.popen(cmd, **kw) if self.link else subprocess.Popen(cmd, **kw)
        self.far_starts += 1

    def supervise_far(self) -> None:
        if self.far is not None and self.far.poll() is not None and self.running():
            self.start_far()

    def running(self) -> bool:
        return self.launcher.poll() is None

    def pid(self, component: str) -> int | None:
        """The newest process the launcher started for ``component``."""
        if component == "far-0":
            return self.far.pid if self.far and self.far.poll() is None else None
        starts = [r for r in records(self.dir / "metrics" / "launcher.jsonl")
                  if r.get("event") == "start" and r.get("component") == component]
        return starts[-1]["pid"] if starts and alive(starts[-1]["pid"]) else None

    def targets(self) -> dict[str, int]:
        """What the driver may signal now: name -> pid (the verifier's ranks apart)."""
        out = {}
        for name in COMPONENTS:
            if (pid := self.pid(name)) is not None:
                out[name] = pid
        if (torchrun := out.get("trainer-verifier")) is not None:
            for rank, pid in enumerate(sorted(children(torchrun))):
                out[f"trainer-verifier/rank{rank}"] = pid
        if "agents@raas-0" in COMPONENTS:
            for node in NODES:
                for k, pid in enumerate(agent_workers(out[node]) if node in out else []):
                    out[f"agents@{node}/{k}"] = pid
        return out

    def trained_after(self, when: float) -> float | None:
        """Seconds from ``when`` until every policy still training then logged a step
        after it (a policy whose trainer had finished is not waited for)."""
        firsts = []
        for policy in POLICIES:
            trained = records(self.dir / "metrics" / f"train-{policy}.jsonl")
            if trained and trained[-1]["step"] >= self.steps and trained[-1]["time"] <= when:
                continue
            times = [r["time"] for r in trained if r["time"] > when]
            if not times:
                return None
            firsts.append(min(times))
        return max(firsts) - when if firsts else None

    def finish(self, timeout: float) -> int:
        try:
            code = self.launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # stopped as Ctrl-C stops it: every component
            self.launcher.send_signal(signal.SIGINT)
            try:
                code = self.launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.launcher.kill()
                code = self.launcher.wait()
        if self.far is not None and self.far.poll() is None:
            self.far.terminate()  # its data layer is gone: nothing left to hand in
            try:
                self.far.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.far.kill()
                self.far.wait()
        self.console.close()
        return code


class Driver(threading.Thread):
    """Injects a fault every ``interval`` seconds (uniform in its range), for
    ``minutes`` from the run's first trained step of every policy."""

    def __init__(self, run: Run, seed: int, minutes: float, interval: tuple[float, float],
                 stop_range: tuple[float, float], cut_range: tuple[float, float]) -> None:
        super().__init__(daemon=True, name="chaos")
        self.run_, self.rng = run, random.Random(seed)
        self.minutes, self.interval = minutes, interval
        self.stop_range, self.cut_range = stop_range, cut_range
        self.faults: list[dict[str, Any]] = []
        self.deck: list[str] = []
        self.busy: set[str] = set()  # stopped or cut off, until its timer ends it
        self.timers: list[threading.Timer] = []
        self.done = threading.Event()
        self.started_at: float | None = None
        #: the run outlasted ``minutes`` of faults (else it ended sooner)
        self.lasted = False
        self.lock = threading.Lock()

    def _kinds(self):
        kinds = [k for k in KINDS if k != "partition" or self.run_.link is not None]
        while True:
            self.rng.shuffle(kinds)
            yield from list(kinds)

    def _component(self, choices: list[str]) -> str:
        """The next component of a shuffled round over every one there is: each is hit
        once a round (a finished trainer or one that is down is passed over)."""
        present = sorted({t.split("/")[0] for t in choices})
        for _ in range(2):
            while self.deck:
                component = self.deck.pop()
                if component in present:
                    return component
            self.deck = sorted(COMPONENTS)
            self.rng.shuffle(self.deck)
        return self.rng.choice(present)

    def run(self) -> None:
        run = self.run_
        while run.running() and run.trained_after(0) is None:
            run.supervise_far()
            if self.done.wait(1.0):
                return
        self.started_at = time.time()
        kinds = self._kinds()
        due = self.started_at + self.rng.uniform(*self.interval)
        while run.running() and not self.done.is_set():
            run.supervise_far()
            if time.time() - self.started_at >= self.minutes * 60:
                self.lasted = True
                break
            if time.time() >= due:
                self._inject(next(kinds))
                due = time.time() + self.rng.uniform(*self.interval)
            self.done.wait(0.5)
        while run.running() and not self.done.is_set():  # keep the far node up to the end
            run.supervise_far()
            self.done.wait(0.5)

    def _inject(self, kind: str) -> None:
        targets = self.run_.targets()
        with self.lock:
            choices = sorted(t for t in targets if t not in self.busy
                             and t.split("/")[0] not in self.busy)
            if kind == "partition":
                choices = [t for t in choices if t == "far-0"]
            if not choices:
                return
            # a component first, then one of its processes: the verifier's trainer is one
            # target whether its launcher process or a rank is hit
            component = "far-0" if kind == "partition" else self._component(choices)
            target = self.rng.choice([t for t in choices if t.split("/")[0] == component])
            pid = targets.get(target)
            fault = {"kind": kind, "target": target, "at": time.time(), "pid": pid}
            if kind == "kill":
                os.kill(pid, signal.SIGKILL)
                fault["end"] = fault["at"]
            elif kind == "stop":
                os.kill(pid, signal.SIGSTOP)
                fault["seconds"] = round(self.rng.uniform(*self.stop_range), 1)
                self._later(fault, lambda: os.kill(pid, signal.SIGCONT))
            else:
                self.run_.link.cut()
                fault["seconds"] = round(self.rng.uniform(*self.cut_range), 1)
                self._later(fault, self.run_.link.heal)
            self.faults.append(fault)
        print(f"chaos {time.time() - self.run_.started:6.0f} s: {kind} {target}"
              + (f" for {fault['seconds']} s" if "seconds" in fault else ""), flush=True)

    def _later(self, fault: dict[str, Any], undo) -> None:
        self.busy.add(fault["target"])

        def end() -> None:
            with self.lock:
                with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                    undo()
                fault["end"] = time.time()
                self.busy.discard(fault["target"])

        timer = threading.Timer(fault["seconds"], end)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def stop(self) -> None:
        """Ends every fault still in force (the run must not end with a process stopped)."""
        self.done.set()
        for timer in self.timers:
            if timer.is_alive():
                timer.cancel()
                timer.function()
        self.join(timeout=10)


def ledger(run_dir: Path) -> dict[str, Any]:
    """The data layer's durable counts and each policy's trainer history, checked."""
    counts = store_counts(run_dir / "store")
    done_rows = counts["tasks_done_rows"]
    out: dict[str, Any] = {"tasks_completed": counts.get("tasks_completed", 0),
                           "tasks_done_rows": done_rows, "policies": {}}
    problems = []
    if out["tasks_completed"] != done_rows:
        problems.append(f"{out['tasks_completed']} tasks counted completed, {done_rows} "
                        "done in the store")
    for policy in POLICIES:
        get = counts.get
        row = {"produced": get(f"produced:{policy}", 0), "trained": get(f"consumed:{policy}", 0),
               "held": get(f"held:{policy}", 0), "filtered": get(f"filtered:{policy}", 0),
               "dropped_stale": get(f"dropped_stale:{policy}", 0),
               "dropped_no_trainer": get(f"dropped_no_trainer:{policy}", 0),
               "unaccounted": unaccounted(counts, policy)}
        # the trainer's history: the last record of each step (a restarted trainer trains
        # its journal's steps again, unlogged, on its checkpoint)
        steps: dict[int, dict[str, Any]] = {}
        for record in records(run_dir / "metrics" / f"train-{policy}.jsonl"):
            steps[record["step"]] = record
        batches = [r["batch_id"] for r in steps.values()]
        row["steps_logged"] = len(steps)
        row["trained_twice"] = len(batches) - len(set(batches))
        row["trained_by_trainer"] = sum(r["batch_size"] for r in steps.values())
        # trained by the trainer, not counted by the data layer: acknowledged and lost
        # the other way (counted, never in a step) shows as a difference too
        row["trainer_minus_ledger"] = row["trained_by_trainer"] - row["trained"]
        if row["unaccounted"]:
            problems.append(f"{policy}: {row['unaccounted']} trajectories produced and "
                            "unaccounted for")
        if row["trained_twice"]:
            problems.append(f"{policy}: {row['trained_twice']} batches trained twice")
        if row["trainer_minus_ledger"]:
            problems.append(f"{policy}: the trainer's steps hold {row['trained_by_trainer']} "
                            f"trajectories, the ledger counts {row['trained']} trained")
        out["policies"][policy] = row
    out["problems"] = problems
    return out


def final_accuracy(run_dir: Path, held_out: int) -> dict[str, dict[str, float]]:
    out = {}
    for policy in POLICIES:
        evals = records(run_dir / "metrics" / f"eval-{policy}.jsonl")
        if not evals:
            continue
        acc = evals[-1]["eval_accuracy"]
        out[policy] = {"accuracy": acc, "version": evals[-1]["version"],
                       "se": math.sqrt(max(acc * (1 - acc), 1e-12) / held_out)}
    return out


def held_out_tasks(run_dir: Path) -> int:
    from omegaconf import OmegaConf

    from astraflow.plugins import get_registry

    cfg = OmegaConf.load(run_dir / "config.yaml")
    return len(get_registry().get("task", cfg.task.name).create(cfg.task).eval_tasks())


def summary(run: Run, code: int, steps: int) -> dict[str, Any]:
    path = run.dir / "summary.json"
    policies = json.loads(path.read_text())["policies"] if path.exists() else {}
    restarts = [r for r in records(run.dir / "metrics" / "launcher.jsonl")
                if r.get("event") == "restart"]
    # the run ended when it wrote its summary (the other run may have ended long after)
    ended = path.stat().st_mtime if path.exists() else time.time()
    return {"exit_code": code, "wall_seconds": ended - run.started,
            "steps": {p: policies.get(p, {}).get("steps") for p in POLICIES},
            "completed": code == 0 and all(policies.get(p, {}).get("steps") == steps
                                           for p in POLICIES),
            "restarts": [r["component"] for r in restarts],
            "far_node_starts": run.far_starts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="inject faults for this long (the run must last longer)")
    parser.add_argument("--seed", type=int, default=0, help="the runs' and the faults' seed")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--interval", type=float, nargs=2, default=(20.0, 60.0))
    parser.add_argument("--stop-seconds", type=float, nargs=2, default=(5.0, 30.0))
    parser.add_argument("--cut-seconds", type=float, nargs=2, default=(10.0, 60.0))
    parser.add_argument("--concurrency", type=int, default=32, help="tasks in flight a node")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="median seconds of a log-normal environment call per turn "
                             "(0: none): a paced run, light on the CPU")
    parser.add_argument("--agent", action="store_true",
                        help="workflow=agent (one policy; agent workers among the targets) "
                             "instead of solve_verify")
    parser.add_argument("--no-calm", action="store_true",
                        help="no side-by-side run without faults (no accuracy check)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("overrides", nargs="*", help="more run settings (key=value)")
    args = parser.parse_args()
    # stopped from outside, it still stops its runs and removes its network namespace
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shape = agent_shape() if args.agent else ["workflow=solve_verify",
                                              "policies.verifier.world_size=2"]
    overrides = [*shape, f"seed={args.seed}", f"steps={args.steps}",
                 f"batch_size={args.batch_size}", "num_nodes=2",
                 f"node_concurrency={args.concurrency}", f"eval_every={args.steps}",
                 # the driver kills a component more often than a crash loop would: the
                 # restart budget is not what is measured
                 "launcher.max_restarts=100",
                 *([] if not args.latency else [
                     "workflow.latency.kind=lognormal", f"workflow.latency.median={args.latency}",
                     "workflow.latency.sigma=0.5"]),
                 *args.overrides]
    cpu = cpu_model()
    print(f"CPU: {cpu}", flush=True)
    result: dict[str, Any] = {"cpu": cpu, "config": {**vars(args), "out": str(args.out)},
                              "overrides": overrides}
    link = None
    if os.geteuid() == 0:
        try:
            link = FarLink(os.getpid() % 250).__enter__()
        except OSError as exc:
            print(f"no network namespace ({exc}): the far node runs on loopback, no "
                  "partitions", flush=True)
    else:
        print("not root: the far node runs on loopback, no partitions", flush=True)
    result["partitions"] = link is not None
    with tempfile.TemporaryDirectory(prefix="astraflow-chaos-") as tmp:
        root = Path(tmp)
        try:
            result.update(_both(args, overrides, root, link))
        finally:
            if link is not None:
                link.__exit__()
            if os.environ.get("ASTRAFLOW_CHAOS_KEEP"):
                import shutil

                shutil.copytree(root, os.environ["ASTRAFLOW_CHAOS_KEEP"], dirs_exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")
    if result["failed"]:
        raise SystemExit("chaos: " + "; ".join(result["failed"]))


def _both(args: argparse.Namespace, overrides: list[str], root: Path,
          link: FarLink | None) -> dict[str, Any]:
    runs = {"chaos": Run("chaos", root, overrides, link, args.concurrency, args.steps)}
    if not args.no_calm:
        runs["calm"] = Run("calm", root, overrides, None, args.concurrency, args.steps)
    for run in runs.values():  # the far nodes join once each run's data layer is up
        while run.running() and not (run.url() and (run.dir / "config.yaml").exists()):
            time.sleep(0.2)
        if run.running():
            run.start_far()
    driver = Driver(runs["chaos"], args.seed, args.minutes, tuple(args.interval),
                    tuple(args.stop_seconds), tuple(args.cut_seconds))
    driver.start()
    calm_watch = threading.Thread(target=_keep_far, args=(runs.get("calm"),), daemon=True)
    calm_watch.start()
    out: dict[str, Any] = {}
    try:
        codes = {}
        while runs["chaos"].running():
            time.sleep(1.0)
        driver.stop()
        codes["chaos"] = runs["chaos"].finish(60)
        if "calm" in runs:
            codes["calm"] = runs["calm"].finish(3600)
    finally:
        driver.stop()
        for run in runs.values():
            if run.running():
                run.finish(0)
    for name, run in runs.items():
        out[name] = summary(run, codes[name], args.steps)
        if codes[name] != 0:
            print(f"{name}: exited {codes[name]}; the end of its console:\n"
                  + "\n".join((root / f"{name}.console").read_text().splitlines()[-20:]))
    return _report(args, runs, driver, out)


def _keep_far(run: Run | None) -> None:
    while run is not None and run.running():
        run.supervise_far()
        time.sleep(1.0)


def _report(args: argparse.Namespace, runs: dict[str, Run], driver: Driver,
            out: dict[str, Any]) -> dict[str, Any]:
    chaos = runs["chaos"]
    failed = []
    for name in runs:
        if not out[name]["completed"]:
            failed.append(f"the {name} run did not complete its steps "
                          f"({out[name]['steps']} of {args.steps}, exit {out[name]['exit_code']})")
    minutes = (driver.faults[-1]["at"] - driver.started_at) / 60 if driver.faults else 0.0
    print(f"\n{len(driver.faults)} faults over {minutes:.1f} min; chaos run "
          f"{out['chaos']['wall_seconds']:.0f} s" + (
              f", calm run {out['calm']['wall_seconds']:.0f} s "
              f"({out['chaos']['wall_seconds'] / out['calm']['wall_seconds']:.2f}x)"
              if "calm" in out else ""))
    print(f"{'t (s)':>7}  {'fault':<10} {'target':<26} {'lasted':>7}  recovered after")
    for fault in driver.faults:
        end = fault.get("end", fault["at"])
        fault["recovered_seconds"] = chaos.trained_after(end)
        fault["t"] = round(fault["at"] - chaos.started, 1)
        rec = fault["recovered_seconds"]
        print(f"{fault['t']:7.0f}  {fault['kind']:<10} {fault['target']:<26} "
              f"{fault.get('seconds', 0):6.0f}s  "
              + (f"{rec:.1f} s" if rec is not None else "no step after it"))
    last_steps = [max((r["time"] for r in records(chaos.dir / "metrics" / f"train-{p}.jsonl")),
                      default=0.0) for p in POLICIES]
    # a fault that ended before the last policy's last step must have been recovered from
    unrecovered = [f"{f['kind']} {f['target']} at {f['t']:.0f} s" for f in driver.faults
                   if f["recovered_seconds"] is None and f.get("end", f["at"]) < max(last_steps)]
    if unrecovered:
        failed.append(f"no step after {', '.join(unrecovered)}")
    if not driver.lasted:
        failed.append(f"the chaos run ended {minutes:.1f} min into the faults, before "
                      f"--minutes={args.minutes:g} (give it more --steps)")
    out["faults"] = driver.faults
    for name, run in runs.items():
        out[name]["ledger"] = ledger(run.dir)
        for problem in out[name]["ledger"]["problems"]:
            failed.append(f"{name} ledger: {problem}")
        print(f"{name} ledger: " + "; ".join(
            f"{p}: {r['produced']} produced = {r['trained']} trained + {r['held']} held + "
            f"{r['filtered']} filtered + {r['dropped_stale']} stale + "
            f"{r['dropped_no_trainer']} no trainer ({r['unaccounted']} unaccounted); "
            f"{r['trained_twice']} batches trained twice; trainer vs ledger "
            f"{r['trainer_minus_ledger']:+d}"
            for p, r in out[name]["ledger"]["policies"].items()))
    if "calm" in runs and out["chaos"]["completed"] and out["calm"]["completed"]:
        n = held_out_tasks(chaos.dir)
        acc = {name: final_accuracy(run.dir, n) for name, run in runs.items()}
        out["accuracy"] = {"held_out_tasks": n, **acc}
        for policy in POLICIES:
            c, k = acc["chaos"].get(policy), acc["calm"].get(policy)
            if c is None or k is None:
                failed.append(f"{policy}: no final held-out accuracy")
                continue
            bound = 2 * math.hypot(c["se"], k["se"])
            gap = c["accuracy"] - k["accuracy"]
            ok = abs(gap) <= bound
            print(f"{policy}: held-out accuracy {c['accuracy']:.3f} with chaos, "
                  f"{k['accuracy']:.3f} calm: {gap * 100:+.1f} points, bound "
                  f"+-{bound * 100:.1f} (two standard errors over {n} tasks): "
                  + ("within" if ok else "OUTSIDE"))
            if not ok:
                failed.append(f"{policy}: accuracy {gap * 100:+.1f} points from the calm run, "
                              f"beyond two standard errors ({bound * 100:.1f})")
    out["failed"] = failed
    print("chaos: every check passed" if not failed else "chaos: FAILED\n  " + "\n  ".join(failed),
          flush=True)
    return out


if __name__ == "__main__":
    main()
