"""Reads `kope memory export` (JSON) on stdin; prints how many attempts each task's search
made, confirmations of an earlier figure left out (a run may confirm again a figure that
load disturbed, and search no more)."""

import json
import sys
from collections import Counter

graph = json.load(sys.stdin)
searched = Counter(
    node["record"]["task"]
    for node in graph["nodes"]
    if node["type"] == "attempt" and not node["record"]["confirms"]
)
for task, count in sorted(searched.items()):
    print(task, count)
