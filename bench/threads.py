#!/usr/bin/env python3
"""CPU use of each thread of process PID over SECS seconds, and the machine's idle share.

    python3 bench/threads.py PID SECS

Reads /proc (utime + stime of each thread, /proc/stat for the machine) twice, SECS apart;
prints the threads grouped by name (the graph's workers are named after their stage:
gpu-0, process-3, write-0, ...), then each thread."""
import os, sys, time, collections
if len(sys.argv) != 3:
    sys.exit("usage: threads.py PID SECS")
pid, secs = int(sys.argv[1]), float(sys.argv[2])
if not 0 < secs <= 3600:
    sys.exit(f"threads.py: SECS must be more than 0 and at most 3600, not {secs}")
def snap():
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[tid] = (comm, int(f[11]) + int(f[12]))
        except OSError:
            pass
    cpu = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return out, cpu
a, ca = snap(); t0 = time.time(); time.sleep(secs); b, cb = snap(); dt = time.time() - t0
hz = os.sysconf("SC_CLK_TCK")
d = [x - y for x, y in zip(cb, ca)]
print(f"machine: idle {100*(d[3]+d[4])/sum(d):.0f}%, user {100*d[0]/sum(d):.0f}%, system {100*d[2]/sum(d):.0f}%, irq+softirq {100*(d[5]+d[6])/sum(d):.0f}% over {dt:.2f} s")
groups = collections.defaultdict(lambda: [0, 0.0])
rows = []
for tid, (comm, t) in b.items():
    pct = 100 * (t - a.get(tid, (comm, t))[1]) / hz / dt
    rows.append((pct, tid, comm))
    g = comm.split("-")[0] if comm[-1:].isdigit() else comm
    groups[g][0] += 1; groups[g][1] += pct
for g, (n, p) in sorted(groups.items(), key=lambda x: -x[1][1]):
    print(f"  {g:<20} {n:>3} threads {p:7.1f}% CPU ({p/n:5.1f}% each)")
for pct, tid, comm in sorted(rows, reverse=True)[:40]:
    print(f"    {tid:>8} {comm:<20} {pct:6.1f}%")
