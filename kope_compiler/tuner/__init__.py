"""The tuner: which kernel each Task runs, and the loop that finds better ones.

`optimize` is the loop of one operator (experience from `experience`, proposals from an agent
of `kope.agents`, figures from a target); `measuring` takes the figures selection needs and
`selection` chooses from the store by memory's rule. The tuner may import the agents and the
core, never the front end or the tools.
"""
