"""tests/psvtest.py — what the Python tests that drive `pensieve serve` share: a thread-safe
check counter that prints the `N passed, N failed, N skipped` summary, an ephemeral loopback
port, and stopping a server with SIGTERM. Standard library only."""
import signal
import socket
import subprocess
import sys
import threading


class Checks:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self._lock = threading.Lock()

    def check(self, cond, what):
        with self._lock:
            if cond:
                self.passed += 1
            else:
                self.failed += 1
                print("FAIL:", what, file=sys.stderr)
        return cond

    def summary(self):
        print("%d passed, %d failed, %d skipped" % (self.passed, self.failed, self.skipped))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def stop(proc, timeout=15):
    """SIGTERM, then the exit status (None if it had to be killed)."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None
