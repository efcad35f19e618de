"""A throwaway multi-host network made of Linux network namespaces and veth pairs.

Everything lives in namespaces this module creates (names carry a per-run tag): one "switch"
namespace holds a bridge per network segment, and each host namespace gets one veth per
segment it joins, plugged into that segment's bridge. The host's own interfaces, routes and
addresses are never touched. :meth:`Net.close` kills the processes it started and deletes every
namespace, whatever state the test left them in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence


class NetnsUnavailable(RuntimeError):
    pass


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed ({r.returncode}): {r.stderr.strip()}")


class NsProc:
    """``ip netns exec NS argv...``; ``ready`` is the first stdout line containing the
    ``ready`` marker (``ip netns exec`` execs, so the pid is the command's own)."""

    def __init__(self, ns: str, argv: Sequence[str], ready: str | None,
                 *, timeout: float = 30.0) -> None:
        self.ns = ns
        self.args = list(argv)
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.ready = ""
        marker = ready
        event = threading.Event()

        def read_out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.stdout.append(line)
                if marker is not None and not self.ready and marker in line:
                    self.ready = line.strip()
                    event.set()
            event.set()

        def read_err() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr.append(line)

        self._threads = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
        for t in self._threads:
            t.start()
        if marker is not None and (not event.wait(timeout) or not self.ready):
            self.stop()
            raise RuntimeError(f"{' '.join(argv[:4])} in {ns} not ready:\n"
                               f"{''.join(self.stderr)[-3000:]}")

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(5)
        return rc

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode


class Net:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.namespaces: list[str] = []
        self.procs: list[NsProc] = []
        self.switch = self._add_ns("sw")
        self.segments: set[str] = set()

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def _add_ns(self, host: str) -> str:
        name = self.ns(host)
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def host(self, name: str, links: dict[str, str]) -> str:
        """A host namespace with one interface per segment: ``{"seg": "10.77.1.10/24"}``."""
        ns = self._add_ns(name)
        for i, (segment, cidr) in enumerate(links.items()):
            if segment not in self.segments:
                _ip("-n", self.switch, "link", "add", f"br-{segment}", "type", "bridge")
                _ip("-n", self.switch, "link", "set", f"br-{segment}", "up")
                self.segments.add(segment)
            port = f"{name[:6]}-{segment[:5]}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth",
                "peer", "name", f"eth{i}", "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", f"br-{segment}")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", cidr, "dev", f"eth{i}")
            _ip("-n", ns, "link", "set", f"eth{i}", "up")
        return ns

    def run(self, host: str, args: Sequence[str], ready: str | None, *, python: bool = True,
            timeout: float = 30.0) -> NsProc:
        """Run ``args`` on ``host`` (under this interpreter unless ``python`` is false)."""
        argv = [sys.executable, *args] if python else list(args)
        p = NsProc(self.ns(host), argv, ready, timeout=timeout)
        self.procs.append(p)
        return p

    def close(self) -> list[str]:
        errors = []
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception as exc:  # keep tearing down
                errors.append(f"stop {p.args[:3]}: {exc!r}")
        for ns in reversed(self.namespaces):
            r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if r.returncode != 0:
                errors.append(f"ip netns del {ns}: {r.stderr.strip()}")
        self.namespaces.clear()
        return errors
