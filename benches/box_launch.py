#!/usr/bin/env python3
"""What a box costs an agent's launch and its memory (BENCHMARKS.md, "The agent's box").

Starts the test agent 20 times unboxed and 20 times in a box made with the same bubblewrap arguments berth
uses (namespaces, no capabilities, the seccomp filter read from a file, a network namespace of its own,
the system read-only, a worktree and a home read-write) and times each from the start of the process to
its first answer to a prompt; prints the medians. Then keeps 16 boxed agents idle and prints what the box
adds per agent: the proportional set size (PSS) of bwrap's own two processes.

Usage: benches/box_launch.py [path to berth-test-agent] (default target/release/berth-test-agent)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

AGENT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/berth-test-agent")
RUNS = 20
PROMPT = json.dumps({"type": "prompt", "message": "pwd"}) + "\n"


def box_args(work, home):
    args = ["bwrap", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
            "--unshare-net", "--cap-drop", "ALL", "--hostname", "berth-agent"]
    for path in ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"]:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run",
             "--ro-bind", os.path.dirname(AGENT), os.path.dirname(AGENT),
             "--bind", home, home, "--bind", work, work, "--chdir", work]
    return args


def first_answer(argv, cwd, pass_fds=()):
    started = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         pass_fds=pass_fds)
    p.stdin.write(PROMPT)
    p.stdin.flush()
    for line in p.stdout:
        if '"message_end"' in line and '"assistant"' in line:
            break
    took = time.perf_counter() - started
    p.stdin.close()
    p.wait()
    return took


def seccomp_fd():
    # The filter berth passes (src/runtime/sandbox/seccomp.rs) is built in Rust; an allow-all program of the
    # same length stands in, so bwrap does the same work of reading and installing one.
    program = b"".join([(0x06).to_bytes(2, "little") + b"\0\0" + (0x7FFF0000).to_bytes(4, "little")] * 48)
    r, w = os.pipe()
    os.write(w, program)
    os.close(w)
    return r


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        work, home = os.path.join(tmp, "work"), os.path.join(tmp, "home")
        os.makedirs(work)
        os.makedirs(home)
        bare = [first_answer([AGENT], work) for _ in range(RUNS)]
        boxed = []
        for _ in range(RUNS):
            fd = seccomp_fd()
            boxed.append(first_answer(box_args(work, home) + ["--seccomp", str(fd), "--", AGENT], work, (fd,)))
            os.close(fd)
        mb, mx = statistics.median(bare) * 1000, statistics.median(boxed) * 1000
        print(f"first answer, median of {RUNS}: unboxed {mb:.1f} ms, boxed {mx:.1f} ms, the box adds {mx - mb:.1f} ms")

        agents = []
        for _ in range(16):
            p = subprocess.Popen(box_args(work, home) + ["--", AGENT], cwd=work, stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, text=True)
            agents.append(p)
        time.sleep(1.0)
        per_box = []
        for p in agents:
            children = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            per_box.append(pss_kib(p.pid) + sum(pss_kib(int(c)) for c in children if c))
        for p in agents:
            p.stdin.close()
            p.wait()
        print(f"16 idle boxes: bwrap's two processes take {statistics.mean(per_box) / 1024:.2f} MiB PSS per agent")


if __name__ == "__main__":
    main()
