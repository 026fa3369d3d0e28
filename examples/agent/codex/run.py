"""Codex CLI as the agent, unchanged: one ``codex exec`` per rollout, in a working
directory and a home of its own (made empty, removed after), against the node's
Responses API (a provider with ``wire_api="responses"`` at ``OPENAI_BASE_URL``, the key
in ``OPENAI_API_KEY``, the policy in ``ASTRAFLOW_MODEL``). The reward: 1 if the task's
answer is in Codex's last message, else 0. Codex exiting non-zero fails the rollout.

Train it (a chat model whose context holds Codex's ~26k-token prompt):

    python -m astraflow workflow=agent \\
        agent.command="python examples/agent/codex/run.py" agent.max_tokens_cap=512 \\
        model.path=~/models/my-chat-model task=jsonl task.train_files=[train.jsonl]

``CODEX_BIN`` names the executable; else ``codex`` on PATH; else the pinned version is
installed from the npm registry into the cache (``astraflow.testing.harnesses``).
``CODEX_ARGS`` adds arguments (default: ``--sandbox workspace-write``).
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
    extra = shlex.split(os.environ.get("CODEX_ARGS", "--sandbox workspace-write"))
    provider = {"name": "astraflow", "base_url": os.environ["OPENAI_BASE_URL"],
                "env_key": "OPENAI_API_KEY", "wire_api": "responses"}
    table = "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in provider.items()) + "}"
    with tempfile.TemporaryDirectory(prefix="codex-rollout-") as root:
        home, work = os.path.join(root, "home"), os.path.join(root, "work")
        os.makedirs(home)
        os.makedirs(work)
        last = os.path.join(root, "last-message.txt")
        done = subprocess.run(
            [harness("codex"), "exec", "--skip-git-repo-check", "--ephemeral",
             "-m", os.environ["ASTRAFLOW_MODEL"], "-c", "model_provider=astraflow",
             "-c", f"model_providers.astraflow={table}", "-o", last, *extra, task["prompt"]],
            cwd=work, env={**os.environ, "HOME": home}, capture_output=True, text=True,
            stdin=subprocess.DEVNULL, check=False)
        result = ""
        if os.path.exists(last):
            with open(last) as fh:
                result = fh.read()
    if done.returncode != 0:
        sys.exit(f"codex exited {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
    answer = str(task.get("answer") or "")
    print(json.dumps({"reward": float(bool(answer) and answer in result)}))


if __name__ == "__main__":
    main()
