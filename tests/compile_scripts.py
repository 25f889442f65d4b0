"""Run one of the offline compile scripts beside this file (coop_compile.py, smem_compile.py,
kernel_compile.py) in a process of its own, away from TRITON_INTERPRET, and return its JSON output."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_compile_script(script: str, *args: str, timeout: int = 1800):
    """``python tests/<script> *args`` with the repository importable; its stdout parsed as JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, os.path.join(HERE, script), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
