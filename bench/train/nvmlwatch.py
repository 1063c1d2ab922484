"""nvmlwatch.py PID: polls NVML for the GPU memory process PID uses, every
2 ms, from a process of its own (so that polling takes no GIL from the
program it watches), until its stdin closes; then prints the peak in bytes
and exits. Its first output line, "ready", says polling has started."""

import sys
import threading
import time

import pynvml


def used(handles, pid):
    total = 0
    for h in handles:
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == pid and p.usedGpuMemory is not None:
                total += p.usedGpuMemory
    return total


def main():
    pid = int(sys.argv[1])
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    peak = 0
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("ready", flush=True)
    while not done.is_set():
        peak = max(peak, used(handles, pid))
        time.sleep(0.002)
    peak = max(peak, used(handles, pid))
    print(peak, flush=True)


if __name__ == "__main__":
    main()
