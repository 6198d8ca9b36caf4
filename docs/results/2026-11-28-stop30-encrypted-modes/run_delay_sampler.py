"""Every 0.25 s, the CPU share and the run-delay share (time spent runnable but waiting for a
CPU, from /proc/PID/task/TID/schedstat) of every thread of every running vnetd, over the last
interval. Output lines: seconds since start, pid, thread name, CPU %, run delay %.

Usage: python3 run_delay_sampler.py OUT SECONDS (while a benchmark runs)."""
import os
import sys
import time

out = open(sys.argv[1], "w")
prev = {}
t0 = time.time()
end = t0 + float(sys.argv[2])
while time.time() < end:
    now = time.time()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/comm").read().strip() != "vnetd":
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                cpu, delay, _ = map(int, open(f"/proc/{pid}/task/{tid}/schedstat").read().split())
                if (pid, tid) in prev:
                    pt, pc, pd = prev[(pid, tid)]
                    dt = now - pt
                    out.write(f"{now - t0:.2f} {pid} {comm} {100 * (cpu - pc) / 1e9 / dt:.1f} "
                              f"{100 * (delay - pd) / 1e9 / dt:.1f}\n")
                prev[(pid, tid)] = (now, cpu, delay)
        except OSError:
            pass  # a thread or process that ended meanwhile
    time.sleep(0.25)
