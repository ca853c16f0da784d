#!/usr/bin/env python3
"""What an nvlinkd daemon did, in words, from its `nvlinkd stats --json`.

    stats-words.py AFTER [BEFORE] [--log FILE --from LINE]

AFTER and BEFORE are the JSON objects `nvlinkd stats --json` printed; the
sentence describes the links between the two (all of them without BEFORE).
With --log, the daemon's log from line LINE on names why links went to the
real nvlink engine (best effort: the reason is left out when the log does not
say it in the form this script knows).
"""

import json
import re
import sys


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def routed_reasons(log, first_line):
    """Why links went to the real nvlink, from the daemon's "link done" lines."""
    reasons = []
    try:
        with open(log, errors="replace") as f:
            lines = f.readlines()[first_line:]
    except OSError:
        return reasons
    for line in lines:
        if "link done" not in line or "NvlinkProcess" not in line:
            continue
        m = re.search(r'routed=Some\("((?:[^"\\]|\\.)*)"\)', line)
        if m and m.group(1) not in reasons:
            reasons.append(m.group(1).replace('\\"', '"'))
    return reasons


def main(argv):
    log, first_line = None, 0
    if "--log" in argv:
        i = argv.index("--log")
        log = argv[i + 1]
        del argv[i : i + 2]
    if "--from" in argv:
        i = argv.index("--from")
        first_line = int(argv[i + 1])
        del argv[i : i + 2]
    after = json.loads(argv[0])
    before = json.loads(argv[1]) if len(argv) > 1 and argv[1] else {}
    d = {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, int)}

    # (count, what happened to that many links)
    parts = []
    if d.get("in_process"):
        parts.append((d["in_process"], "linked in process (libnvJitLink, in a worker process)"))
    if d.get("nvlink_process"):
        why = routed_reasons(log, first_line) if log else []
        because = f": {'; '.join(why)}" if why else ""
        parts.append(
            (
                d["nvlink_process"],
                "linked by the real nvlink, run by the daemon as its engine "
                f"(a kind of link nvlinkd does not yet reproduce in process{because})",
            )
        )
    if d.get("cache_hits"):
        parts.append((d["cache_hits"], "served from the cache"))
    if d.get("frontend"):
        parts.append((d["frontend"], "answered without linking (help, version, an option error)"))
    if d.get("fallbacks"):
        parts.append((d["fallbacks"], "handed back to the shim, which ran the real nvlink"))
    n = d.get("requests", 0)
    if n == 0:
        print("no link reached nvlinkd")
    elif len(parts) == 1 and parts[0][0] == n:
        print(f"{plural(n, 'link')} through nvlinkd, {parts[0][1]}")
    else:
        print(f"{plural(n, 'link')} through nvlinkd: " + "; ".join(f"{c} {what}" for c, what in parts))
    if d.get("worker_crashes"):
        print(f"  ({plural(d['worker_crashes'], 'worker process')} crashed; those links ran with the real nvlink)")


if __name__ == "__main__":
    main(sys.argv[1:])
