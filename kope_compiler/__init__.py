"""KOPE: a PyTorch compiler backend that finds, verifies and remembers the fastest kernel per
operator.

`torch.compile(model, backend="kope")` works without importing this package (the backend is
registered through the `torch_dynamo_backends` entry point). Import it to inspect what ran:

    import kope
    kope.check_options({"kernels": "auto"})   # fail fast: the backend sees options late
    print(kope.report().format_table())
"""

from __future__ import annotations

__version__ = "0.2.0"

from kope.core.errors import KopeError, OptionError
from kope.core.logs import configure_from_env as _configure_logging
from kope.core.options import check_options
from kope.frontend.report import report, reset_report

_configure_logging()

__all__ = ["KopeError", "OptionError", "__version__", "check_options", "report", "reset_report"]
