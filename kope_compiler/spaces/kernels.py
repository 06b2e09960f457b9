"""A kernel's source for a configuration: the payload with its schedule, or a payload a
configuration rewrites first (a matmul taking B in panels, a convolution as a product of
its windows' columns, a depthwise convolution by blocks of rows in registers, attention by
blocks of query rows)."""

from __future__ import annotations

from kope.passes.analysis import PayloadInfo
from kope.spaces.attention import attention_kernel
from kope.spaces.depthwise import depthwise_kernel
from kope.spaces.im2col import im2col_kernel
from kope.spaces.schedules import Config, attach, packed_kernel, render


def kernel_source(payload: str, info: PayloadInfo, config: Config) -> str:
    """The kernel module for `config`: the payload with its schedule; for a packed
    contraction, the payload rewritten to take B in panels (`packed_kernel`); for a
    convolution as im2col, rewritten to copies and a product (`im2col_kernel`); for a
    depthwise convolution by row blocks, rewritten to loops of vectors (`depthwise_kernel`); for
    attention, its function rewritten whole (`attention_kernel`)."""
    if config.get("pack"):
        return packed_kernel(payload, info, config)
    if config.get("algorithm") == "im2col":
        return im2col_kernel(payload, info, config)
    if config.get("algorithm") == "rows":
        return depthwise_kernel(payload, info, config)
    if config.get("family") == "attention":
        return attention_kernel(payload, info, config)
    return attach(payload, render(info, config))
