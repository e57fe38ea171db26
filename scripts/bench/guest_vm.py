"""What the benchmark scripts that boot the test guest under a VMM share:
reading the guest's serial log, waiting for a line on it, stopping the
VMM, and calling our ch-remote.

A script in this folder imports it by name (Python puts the script's own
folder first on its path).
"""

import os
import signal
import subprocess
import time

POLL_S = 0.005


def serial_text(path):
    """The serial log so far ("" before the VMM has made it)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_serial(proc, path, needle, deadline, poll_s=POLL_S):
    """Polls the serial log until it holds needle; returns its text. Fails
    on RESULT: FAIL, a VMM that exited, or the deadline (time.monotonic),
    with the log's tail in the error."""
    while True:
        text = serial_text(path)
        if needle in text:
            return text
        if "RESULT: FAIL" in text:
            raise RuntimeError(f"guest failed:\n{text[-3000:]}")
        if proc.poll() is not None:
            raise RuntimeError(f"VMM exited ({proc.returncode}) before {needle!r}:\n"
                               f"{text[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {needle!r} on the serial port in time:\n{text[-3000:]}")
        time.sleep(poll_s)


def stop(proc):
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def remote(bin_dir, sock, *verb, timeout=600):
    """Our ch-remote VERB... on the API socket; returns its stdout, raises
    with its stderr when it fails."""
    r = subprocess.run([os.path.join(bin_dir, "ch-remote"), "--api-socket", sock, *verb],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"ch-remote {' '.join(verb)}: {r.stderr.strip()}")
    return r.stdout
