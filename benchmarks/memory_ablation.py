"""Does memory help? The heuristic agent with the experience graph vs with an empty one.

    python benchmarks/memory_ablation.py [--budget 4] [--seeds 0,1,2] [--report out.json]

Same agent, same static priors, on the fixed sequence `kope.tools.suite.SEQUENCE` (matmuls of four
shapes, then softmaxes, then layer norms), at a small budget: mean and spread over seeds of the
geomean speedup over eager, the pass rate, and the attempts needed to reach 90% of the best
kernel either arm found. Same as `kope bench ablation`.
"""

import sys

from kope.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "ablation", *sys.argv[1:]]))
