"""An agent run as a command (any language does): the endpoint and key arrive in the
environment, the task as JSON in ASTRAFLOW_TASK; the reward goes to stdout as JSON
(``null``: the run's reward scores the last reply).

Train it: python -m astraflow workflow=agent agent.command="python examples/agent/command_agent.py"
"""

import json
import os

from openai import OpenAI

task = json.loads(os.environ["ASTRAFLOW_TASK"])
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
reply = client.chat.completions.create(
    model=os.environ["ASTRAFLOW_MODEL"], max_tokens=8,
    messages=[{"role": "user", "content": task["prompt"]}])
answer = reply.choices[0].message.content.strip()
print(json.dumps({"reward": float(answer == task["answer"])}))
