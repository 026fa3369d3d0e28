"""Claude Code as the agent, unchanged: one ``claude -p`` per rollout, in a working
directory and a home of its own (made empty, removed after), against the node's
endpoint (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_MODEL`` come from
the environment). The reward: 1 if the task's answer is in Claude Code's final result,
else 0. Claude Code exiting non-zero fails the rollout (counted, kept out of training).

Train it (a chat model whose context holds Claude Code's ~35k-token prompt):

    python -m astraflow workflow=agent \\
        agent.command="python examples/agent/claude_code/run.py" agent.max_tokens_cap=512 \\
        model.path=~/models/my-chat-model task=jsonl task.train_files=[train.jsonl]

``CLAUDE_BIN`` names the executable; else ``claude`` on PATH; else the pinned version is
installed from the npm registry into the cache (``astraflow.testing.harnesses``).
``CLAUDE_ARGS`` adds arguments (default: ``--max-turns 4 --allowedTools Bash``).
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile

from astraflow.testing.harnesses import harness


def main() -> None:
    task = json.loads(os.environ["ASTRAFLOW_TASK"])
    extra = shlex.split(os.environ.get("CLAUDE_ARGS", "--max-turns 4 --allowedTools Bash"))
    with tempfile.TemporaryDirectory(prefix="claude-rollout-") as root:
        home, work = os.path.join(root, "home"), os.path.join(root, "work")
        os.makedirs(home)
        os.makedirs(work)
        env = {**os.environ, "HOME": home, "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        done = subprocess.run([harness("claude"), "-p", task["prompt"], "--output-format", "json",
                               *extra], cwd=work, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        sys.exit(f"claude exited {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
    result = json.loads(done.stdout).get("result") or ""
    answer = str(task.get("answer") or "")
    print(json.dumps({"reward": float(bool(answer) and answer in result)}))


if __name__ == "__main__":
    main()
