"""Which TCP sockets a process tree listens on, sampled while it runs (Linux /proc).

``with ListenerWatch() as w: ...`` polls /proc/net/tcp and /proc/net/tcp6 every ``period_s``
and keeps every listening socket owned by this process or one of its descendants that did not
exist when the watch started; ``w.exposed()`` lists those not bound to a loopback address.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Listener:
    address: str
    port: int
    command: str

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def _decode(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))   # 4 host-order words
    return str(ipaddress.IPv6Address(words))


def listening() -> dict[str, tuple[str, int]]:
    """Socket inode → (address, port) of every listening TCP socket on the machine."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":                                          # TCP_LISTEN
                addr, port = f[1].split(":")
                out[f[9]] = (_decode(addr), int(port, 16))
    return out


def _tree(root: int) -> set[int]:
    parent = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = open(f"/proc/{pid}/stat").read()
                parent[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def _owners(pids: set[int]) -> dict[str, str]:
    owner = {}
    for pid in pids:
        try:
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()[:120]
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[8:-1]] = cmd
        except OSError:
            pass
    return owner


class ListenerWatch:
    """Context manager sampling the listeners of this process tree (see the module docstring)."""

    def __init__(self, period_s: float = 0.05) -> None:
        self.period_s = period_s
        self.seen: set[Listener] = set()
        self._stop = threading.Event()

    def _sample(self) -> None:
        socks = {k: v for k, v in listening().items() if k not in self._before}
        if socks:
            owners = _owners(_tree(os.getpid()))
            for inode, (addr, port) in socks.items():
                if inode in owners:
                    self.seen.add(Listener(addr, port, owners[inode]))

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> "ListenerWatch":
        self._before = set(listening())
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def exposed(self) -> list[Listener]:
        return sorted(x for x in self.seen if not x.loopback)
