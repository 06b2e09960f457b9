"""`kope.suite`, the operator suite's public name on the command line (`kope precompile
kope.suite:softmax`, bench reports' `kope.suite.OPSET`): the module `kope.tools.suite` itself."""

import sys

from kope.tools import suite

sys.modules[__name__] = suite
