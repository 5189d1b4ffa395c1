# What a child sees of its interpreter (test_warm.py both, copied to a script there): argv, sys.path, cwd,
# __name__, a variable, its output and exit (WARM_EXIT: a code, "raise" or "message"), a thread and atexit.
import atexit
import json
import os
import sys
import threading

atexit.register(lambda: print("atexit ran"))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "var": os.environ.get("WARM_VAR"),
                  "main": __name__, "first": sys.path[1] if len(sys.path) > 1 else None,
                  "loaded_shim": "shim" in sys.modules}))
print("to stderr", file=sys.stderr)
sys.stdout.flush()
threading.Thread(target=lambda: print("thread done"), daemon=False).start()  # joined at exit, before atexit
code = os.environ.get("WARM_EXIT")
if code == "raise":
    raise ValueError("boom")
if code == "message":
    sys.exit("bad input")
if code is not None:
    sys.exit(int(code))
