"""sha256 of a results.json with run-specific fields (paths, clocks, wall times) removed."""
import hashlib
import json
import sys

DROP = {"command", "out", "profile", "started", "ended", "wall_s", "host", "python", "git", "commit",
        "window_check"}  # window_check: added after the first baselines; a function of fields kept
def clean(x):
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items() if k not in DROP and "wall" not in k}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x
for p in sys.argv[1:]:
    d = clean(json.load(open(p)))
    print(hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16], p)
