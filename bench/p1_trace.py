#!/usr/bin/env python3
"""Where P1's milliseconds go before `add-fd`, step by step, from a traced `up`'s log.

A release build with `bench/p1-trace.patch` applied (`git apply bench/p1-trace.patch`: nine
`tracing::debug!` events under the target `p1t`, not in `main`; made against c71652b, re-apply
by hand where it no longer applies) logs, with microsecond wall-clock stamps, when the API
server takes a PATCH in, starts its store write, begins the SQLite transaction and its COMMIT,
and has committed; when the controller's runner starts a reconcile and its hot-plug pass; when
the node agent's VMI watch delivers and its worker wakes. Run P1 against it with a wrapper that
sets

    RUST_LOG=info,p1t=debug,qemu::machine=debug,apiserver::routes=debug

and sends its stderr to a file, e.g. `hotplug-e2e --virtplug WRAPPER --p1 20 ...`; then

    python3 bench/p1_trace.py LOG [N]

prints, per step, the median (min, max) over the plugs found in LOG, in ms from the API server
taking the VM's PATCH in, and the N-th plug's whole timeline (default: none).

Caveat: a step is the first matching event after the previous one, not tied to its request, so
a write running beside the plug (a Lease, a status write) can stand in for the VM's or the VMI's;
read the maxima with the timeline of that plug.
"""
import re
import statistics
import sys

STAMP = re.compile(r"\S+T(\d\d):(\d\d):(\d\d\.\d+)Z")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def at(line):
    m = STAMP.match(line)
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) if m else None


def plugs(lines):
    """Each plug: the lines from the VM's PATCH taken in to `device_add` answered, as (ms, text)."""
    def vm_patch(line):
        return "p1t: patch in" in line and 'resource="virtualmachines"' in line and " request{" in line[:60]

    starts = [i for i, line in enumerate(lines) if vm_patch(line)]
    for i, end in zip(starts, starts[1:] + [len(lines)]):
        line, seg = lines[i], lines[i:end]
        if not any('command="add-fd"' in l for l in seg):
            continue  # an unplug
        t0, out = at(line), []
        for l in seg:
            if at(l) is None:
                continue
            text = re.sub(r"route=\S+ ", "", re.sub(r"^\S+\s+(DEBUG|INFO|WARN)\s+", "", l))
            out.append(((at(l) - t0) * 1000, text))
            if 'command="device_add"' in l:
                break
        yield out


def steps(ev):
    def first(pat, after=-1.0):
        return next((ms for ms, s in ev if ms > after and pat in s), None)

    vm_write, vm_tx, vm_commit, vm_done = first("write begin"), first("persist begin"), first("commit begin"), first("committed")
    vmi_in = first('patch in plural="virtualmachineinstances"', vm_done)
    vmi_write, vmi_tx, vmi_commit, vmi_done = (first(p, vmi_in) for p in ("write begin", "persist begin", "commit begin", "committed"))
    agent = first("vmi event", vmi_done)
    add = next((ms, s) for ms, s in ev if 'command="add-fd"' in s)
    add_sent = add[0] - float(re.search(r"ms=([0-9.]+)", add[1]).group(1))
    dev = next((ms for ms, s in ev if 'command="device_add"' in s), None)
    return {
        "VM patch: handler until its store write": vm_write,
        "VM patch: store queue + SQL": vm_commit - vm_write,
        "VM patch: COMMIT (WAL write, fsync)": vm_done - vm_commit,
        "committed → controller's VMI patch taken in": vmi_in - vm_done,
        "VMI patch: handler until its store write": vmi_write - vmi_in,
        "VMI patch: store queue + SQL": vmi_commit - vmi_write,
        "VMI patch: COMMIT (WAL write, fsync)": vmi_done - vmi_commit,
        "committed → agent's VMI watch event": agent - vmi_done,
        "agent's event → add-fd sent": add_sent - agent,
        "VM patch taken in → add-fd sent": add_sent,
        "add-fd sent → device_add answered": None if dev is None else dev - add_sent,
    }


def main():
    lines = [ANSI.sub("", l.rstrip()) for l in open(sys.argv[1], encoding="utf-8")]
    show = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    table = {}
    for n, ev in enumerate(plugs(lines), 1):
        if n == show:
            for ms, text in ev:
                print(f"{ms:8.3f} {text[:160]}")
            print()
        try:
            found = steps(ev)
        except (TypeError, StopIteration):
            continue  # a plug whose log lacks one of the events (a restart, a cut log)
        for k, v in found.items():
            if v is not None:
                table.setdefault(k, []).append(v)
    if not table:
        sys.exit("no traced plug in the log: was the build patched and RUST_LOG set?")
    print(f"| step (ms, over {len(next(iter(table.values())))} plugs) | median | min | max |")
    print("|---|---:|---:|---:|")
    for k, v in table.items():
        print(f"| {k} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} |")


if __name__ == "__main__":
    main()
