# The lit configuration of KOPE's pass tests: `lit test/lit -v` (pip's lit and filecheck).
import atexit
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
# Each run writes its %t files and its KOPE_HOME into a folder of its own, removed when lit
# exits (KOPE_LIT_KEEP=1 keeps it for debugging): two checkouts, or two runs, never share one.
config.test_exec_root = tempfile.mkdtemp(prefix="kope-lit-")
if not os.environ.get("KOPE_LIT_KEEP"):
    atexit.register(shutil.rmtree, config.test_exec_root, ignore_errors=True)
else:
    lit_config.note(f"keeping lit's output in {config.test_exec_root}")

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
