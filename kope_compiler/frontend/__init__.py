"""The front end: from a dynamo graph to a graph that runs the chosen kernels.

`backend` (the `torch.compile` entry) traces to an aten graph; `rewrites` and `partition` cut
it into Tasks; `compiler` asks the tuner for each Task's kernel and rewires the graph, which
`dispatch` makes lean; `whole_graph` keeps the compiled graph only where it beats eager;
`report` says what ran. `model_module` writes a whole model as one MLIR module the same way.
The front end may import the tuner, the agents and the core, never the tools.
"""
