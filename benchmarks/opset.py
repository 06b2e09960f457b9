"""The agents issue's operator set on CPU: `kope precompile` with the heuristic agent, budget 16.

    python benchmarks/opset.py [--budget 16] [--ops softmax,layer_norm] [--report out.json]

Prints, per operator, the speedup over eager and over the pinned reference lowering (medians
of interleaved runs), attempts and verdict counts, and the two goals: geomean >= 5x over the
reference on the non-elementwise operators, and the agent beating eager by >= 1.1x on at
least a third of the set. Same as `kope bench suite`.
"""

import sys

from kope.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "suite", *sys.argv[1:]]))
