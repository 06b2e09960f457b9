"""The core: what every other room of the driver shares.

A Task and its reference lowering (`task`, `lowering`, `decompositions`), the user's options
(`options`), and the errors and logging every room uses (`errors`, `logs`). The core imports
neither the front end nor the tuner, the agents nor the tools.
"""
