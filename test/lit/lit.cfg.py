# The lit configuration of KOPE's pass tests: `lit test/lit -v` (pip's lit and filecheck).
import os
import shutil
import sys
import tempfile

import lit.formats

config.name = "KOPE"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "lit.local.cfg", "Inputs", "Output"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = os.path.join(tempfile.gettempdir(), "kope-lit")

filecheck = shutil.which("FileCheck") or shutil.which("filecheck")
if filecheck is None:
    lit_config.fatal("FileCheck not found: pip install filecheck")
config.substitutions.append(("%PYTHON", sys.executable))
config.substitutions.append(("FileCheck", filecheck))

for tool in ("kope-opt", "kope"):
    if shutil.which(tool) is None:
        lit_config.fatal(f"{tool} not found on PATH: pip install -e . first")

config.environment["PATH"] = os.environ.get("PATH", "")
config.environment["KOPE_HOME"] = os.path.join(config.test_exec_root, "kope-home")
for name in ("PYTHONPATH", "HOME", "TMPDIR"):
    if name in os.environ:
        config.environment[name] = os.environ[name]
