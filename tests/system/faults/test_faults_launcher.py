"""SIGKILL the data layer, a RaaS node and a trainer mid-run: the launcher restarts each
(the node and the trainer forked again from the preloaded parent), the run completes,
and the data layer's ledger shows nothing lost or counted twice."""

from __future__ import annotations

import json
import time

import launched_runs as runs

#: the sim engine outpaces the trainer (~60 ms a step), and a restarted data layer hands
#: it a backlog at once: 14 steps could all be trained before the trainer was killed
STEPS = 60


def test_run_survives_sigkill_of_data_layer_node_and_trainer(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "faults"
    launcher = runs.start_run(run_dir, tiny_model_dir, f"steps={STEPS}", f"eval_every={STEPS}",
                              "num_nodes=2")

    def step() -> int:
        recs = runs.train_records(run_dir)
        return recs[-1]["step"] if recs else 0

    def restarted(n: int):
        return lambda: len(runs.restarts(run_dir)) >= n

    with runs.reaped(launcher):
        runs.wait_for(lambda: step() >= 2, 240, "trainer step 2", launcher)
        runs.kill("dataflow", f"--store {run_dir}/store")
        runs.wait_for(restarted(1), 60, "the data layer's restart", launcher)
        runs.wait_for(lambda: step() >= 5, 120, "trainer step 5 after the data layer's restart",
                      launcher)
        (node,) = runs.pids_of(" raas ", f"--work-dir {run_dir} ", "--name node-0")
        # forked, yet the launcher's own child with the command line of a fresh start
        start = runs.starts(run_dir, "raas-0")[-1]
        assert (start["pid"], start["forked"]) == (node, True)
        assert runs.parent_of(node) == launcher.pid
        runs.kill(" raas ", f"--work-dir {run_dir} ", "--name node-0")
        runs.wait_for(restarted(2), 60, "the node's restart", launcher)
        runs.wait_for(lambda: step() >= 7, 120, "trainer step 7", launcher)
        killed_at = runs.train_records(run_dir)[-1]["version"]
        trainer = runs.kill(" train ", f"--work-dir {run_dir} ")
        assert runs.starts(run_dir, "trainer-policy")[-1]["pid"] == trainer
        runs.wait_for(restarted(3), 60, "the trainer's restart", launcher)
        _out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]

    assert [r["component"] for r in runs.restarts(run_dir)] == ["dataflow", "raas-0",
                                                                 "trainer-policy"]
    assert all(r["exit_code"] == -9 for r in runs.restarts(run_dir))
    # each was forked from the preloaded parent, at its start and at its restart
    for name in ("raas-0", "trainer-policy"):
        assert [s["forked"] for s in runs.starts(run_dir, name)] == [True, True], name
    assert [s["forked"] for s in runs.starts(run_dir, "dataflow")] == [False, False]
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]
    assert summary["steps"] == STEPS
    # the killed trainer resumed from its checkpoint: its policy's version continued
    versions = [r["version"] for r in runs.train_records(run_dir)]
    after = versions[versions.index(killed_at) + 1:]
    assert after and min(after) > killed_at and after == sorted(after)
    assert summary["final_version"] >= STEPS
    ledger = runs.assert_nothing_lost_or_counted_twice(run_dir, group_size=4)
    assert ledger["consumed:policy"] >= (STEPS - 1) * 8


def test_restarts_are_bounded_and_the_run_then_fails_naming_the_component(tmp_path,
                                                                          tiny_model_dir):
    run_dir = tmp_path / "bounded"
    launcher = runs.start_run(run_dir, tiny_model_dir, "steps=100000", "launcher.max_restarts=1")
    with runs.reaped(launcher):
        for n in (1, 2):
            runs.wait_for(lambda: runs.train_records(run_dir), 240, "a trainer step", launcher)
            runs.wait_for(lambda: runs.pids_of(" raas ", f"--work-dir {run_dir} "), 60, "a node")
            runs.kill(" raas ", f"--work-dir {run_dir} ")
            if n == 1:
                runs.wait_for(lambda: runs.restarts(run_dir), 60, "the node's restart", launcher)
        _out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 1
    assert ("raas-0 exited with -9 after 1 restarts (launcher.max_restarts=1 in "
            "launcher.restart_window=600 s)") in err
    assert not runs.pids_of(f"--work-dir {run_dir} ")  # everything else was stopped


def test_restarts_outside_the_window_do_not_count(tmp_path, tiny_model_dir):
    """One restart allowed per second: a node killed twice, the second time after its
    first restart left the window, is restarted both times and the run goes on."""
    run_dir = tmp_path / "window"
    launcher = runs.start_run(run_dir, tiny_model_dir, "steps=100000",
                              "launcher.max_restarts=1", "launcher.restart_window=1")
    with runs.reaped(launcher):
        for n in (1, 2):
            runs.wait_for(lambda: runs.train_records(run_dir), 240, "a trainer step", launcher)
            runs.wait_for(lambda: runs.pids_of(" raas ", f"--work-dir {run_dir} "), 60, "a node")
            if n == 2:  # the first restart is out of the one-second window
                runs.wait_for(lambda: time.time() - runs.restarts(run_dir)[0]["time"] > 1.5,
                              10, "the window to pass")
            runs.kill(" raas ", f"--work-dir {run_dir} ")
            runs.wait_for(lambda n=n: len(runs.restarts(run_dir)) == n, 60, f"restart {n}",
                          launcher)
        steps = len(runs.train_records(run_dir))
        runs.wait_for(lambda: len(runs.train_records(run_dir)) > steps, 60,
                      "a step after the second restart", launcher)
        assert launcher.poll() is None
