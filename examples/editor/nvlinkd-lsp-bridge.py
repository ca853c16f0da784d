#!/usr/bin/env python3
"""Editor bridge for nvlinkd: device links as problems and progress.

Reads the daemon's event stream (`nvlinkd events --json`, docs/events.md) and
speaks the Language Server Protocol's notifications on stdout, so that an
editor shows every device link of a project without parsing nvlink's text:

- each link is a work-done progress: `window/workDoneProgress/create`, then
  `$/progress` begin (the output's name), report (the phase running, with
  its time), end (how it ended);
- its diagnostics are `textDocument/publishDiagnostics`, keyed by the file
  they name: the source file and line the daemon read from the object's line
  tables (nvcc -lineinfo or -G), else the object (or the archive of a member;
  the link's output when they name none) at its first line; replaced by the
  next link of the same output;
- the editor's `window/workDoneProgress/cancel` cancels the link
  (`nvlinkd cancel ID`).

With --problem-matcher it prints one line per diagnostic instead,
`FILE:1:1: SEVERITY: MESSAGE [CODE]`, for a VS Code task's problem matcher
(see tasks.json beside this file).

    nvlinkd-lsp-bridge.py [--cwd DIR] [--socket PATH] [--problem-matcher]

`NVLINKD` names the nvlinkd binary (default: `nvlinkd` on PATH). Python 3.8+,
standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import threading

SEVERITY = {"error": 1, "fatal": 1, "warning": 2, "info": 3}
SCHEMA = 1


class Bridge:
    def __init__(self, nvlinkd, socket, problem_matcher):
        self.nvlinkd = nvlinkd
        self.socket = socket
        self.problem_matcher = problem_matcher
        self.out = sys.stdout.buffer
        self.lock = threading.Lock()
        self.links = {}  # link id -> {"title", "diagnostics", "key"}
        self.published = {}  # output key -> files with diagnostics
        self.next_request = 1

    def send(self, message):
        body = json.dumps(message).encode()
        with self.lock:
            self.out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.out.flush()

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def progress(self, link, value):
        self.notify("$/progress", {"token": "nvlinkd-link-%d" % link, "value": value})

    def event(self, e):
        if e.get("schema") != SCHEMA:
            return
        kind, link = e["event"], e["link"]
        # A remote caller's link names files of its own machine, not the
        # editor's: not the editor's problems.
        if kind == "link_started" and e.get("origin") == "remote":
            return
        if kind == "link_started":
            outputs = e.get("outputs") or []
            title = "nvlink " + (os.path.basename(outputs[0]) if outputs else " ".join(e["args"]))
            key = outputs[0] if outputs else "link-%d" % link
            self.links[link] = {"title": title, "diagnostics": [], "key": key, "cwd": e["cwd"]}
            if self.problem_matcher:
                return
            self.send({
                "jsonrpc": "2.0", "id": self.next_request,
                "method": "window/workDoneProgress/create",
                "params": {"token": "nvlinkd-link-%d" % link},
            })
            self.next_request += 1
            self.progress(link, {"kind": "begin", "title": title, "cancellable": True})
        elif link not in self.links:
            return
        elif kind in ("phase_started", "phase_progress") and not self.problem_matcher:
            secs = e.get("elapsed_ms", 0) / 1000
            self.progress(link, {"kind": "report", "message": "%s (%.1f s)" % (e["phase"], secs)})
        elif kind == "diagnostic":
            self.links[link]["diagnostics"].append(e)
        elif kind in ("link_finished", "link_cancelled"):
            self.end(link, e)

    def end(self, link, e):
        info = self.links.pop(link)
        if e["event"] == "link_cancelled":
            message = "cancelled (%s)" % e["reason"]
        else:
            message = "exit %d, %s, %.0f ms" % (e["exit_code"], e["engine"], e["ms"])
        if self.problem_matcher:
            for d in info["diagnostics"]:
                fallback = info["key"] if info["key"].startswith("/") else info["cwd"]
                path, line = place(d, info["cwd"], fallback)
                print("%s:%d:1: %s: %s [%s]" % (path, line + 1, d["severity"], d["message"], d["code"]), flush=True)
            return
        self.progress(link, {"kind": "end", "message": message})
        # One publication per file; files of the previous link of this output
        # that have no diagnostics now are cleared.
        by_file = {}
        for d in info["diagnostics"]:
            path, line = place(d, info["cwd"], info["key"])
            by_file.setdefault(path, []).append({
                "range": {"start": {"line": line, "character": 0}, "end": {"line": line, "character": 0}},
                "severity": SEVERITY.get(d["severity"], 3),
                "source": d["tool"],
                "code": d["code"],
                "message": d["message"] + ("" if "member" not in d else " (member %s)" % d["member"]),
                "data": {k: d[k] for k in ("symbol", "symbol_demangled", "member") if k in d},
            })
        if e["event"] == "link_cancelled":
            return
        for path in self.published.get(info["key"], set()) - set(by_file):
            self.notify("textDocument/publishDiagnostics", {"uri": "file://" + path, "diagnostics": []})
        for path, diagnostics in by_file.items():
            self.notify("textDocument/publishDiagnostics", {"uri": "file://" + path, "diagnostics": diagnostics})
        self.published[info["key"]] = set(by_file)

    def read_editor(self, stdin):
        """The editor's messages: `window/workDoneProgress/cancel` cancels a link."""
        while True:
            length = None
            while True:
                line = stdin.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length is None:
                continue
            message = json.loads(stdin.read(length))
            if message.get("method") == "window/workDoneProgress/cancel":
                token = message["params"]["token"]
                if token.startswith("nvlinkd-link-"):
                    subprocess.run(self.command("cancel", token[len("nvlinkd-link-"):]),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def command(self, *args):
        cmd = [self.nvlinkd, args[0]]
        if self.socket:
            cmd += ["--socket", self.socket]
        return cmd + list(args[1:])


def place(d, cwd, fallback):
    """A diagnostic's file and 0-based line: its source line where the daemon
    found one, else its object (or `fallback`) at the first line."""
    source = d.get("source_file")
    if source:
        return os.path.join(cwd, source), max(d.get("line", 1) - 1, 0)
    return d.get("object_path") or fallback, 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cwd", help="only links run in this directory or below (default: all)")
    p.add_argument("--socket", help="the daemon's unix socket (default: nvlinkd's)")
    p.add_argument("--problem-matcher", action="store_true", help="print FILE:1:1: lines instead of LSP")
    a = p.parse_args()
    bridge = Bridge(os.environ.get("NVLINKD", "nvlinkd"), a.socket, a.problem_matcher)
    cmd = bridge.command("events", "--json")
    if a.cwd:
        cmd += ["--cwd", os.path.abspath(a.cwd)]
    events = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    if not a.problem_matcher:
        threading.Thread(target=bridge.read_editor, args=(sys.stdin.buffer,), daemon=True).start()
    for line in events.stdout:
        bridge.event(json.loads(line))
    return events.wait()


if __name__ == "__main__":
    sys.exit(main())
