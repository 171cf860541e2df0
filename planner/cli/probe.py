"""``clusterplan probe``: measure pairwise latency and bandwidth between ranks with
torch.distributed and write a cost matrix for ``clusterplan reorder``."""

from __future__ import annotations

import argparse

from simulator.costmatrix import load_cost_matrix
from simulator.errors import SpecError
from simulator.fileio import atomic_write_text
from simulator.units import format_time, parse_bytes

from planner.measure.network.probe import ProbeSettings, run_probe

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Spawn N processes, pair them up in a round-robin tournament and time "
                     "point-to-point messages between every pair: small ping-pongs for latency, "
                     "large one-way sends for bandwidth, median of repeats. Writes a cost matrix "
                     "for `clusterplan reorder`.")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--nproc", type=int, default=2, metavar="N", help="processes (default 2)")
    p.add_argument("--repeats", type=int, default=9, metavar="K",
                   help="timed repeats per pair and size (median kept; default 9)")
    p.add_argument("--small", default="8", metavar="BYTES", help="latency message (default 8)")
    p.add_argument("--large", default="16MiB", metavar="BYTES",
                   help="bandwidth message (default 16MiB)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="overall limit in seconds (default 120)")
    p.add_argument("--emulate", metavar="MATRIX.json",
                   help="inject this matrix's latency and bandwidth as delays in the send path "
                        "(to test reordering on one machine)")
    p.add_argument("--out", metavar="FILE", help="write the matrix JSON here")
    p.add_argument("--json", action="store_true", help="print the matrix JSON")
    p.set_defaults(func=run)


def run(args) -> int:

    if not 2 <= args.nproc <= 256:
        raise SpecError(f"--nproc {args.nproc} is not in 2..256", field="--nproc",
                        fix="probe at least 2 processes")
    if not 1 <= args.repeats <= 1000:
        raise SpecError(f"--repeats {args.repeats} is not in 1..1000", field="--repeats",
                        fix="use e.g. --repeats 9")
    if not 1 <= args.timeout <= 86400:
        raise SpecError(f"--timeout {args.timeout} is not in 1..86400 s", field="--timeout",
                        fix="use e.g. --timeout 120")
    small = parse_bytes(args.small, field="--small")
    large = parse_bytes(args.large, field="--large")
    if not 4 <= small < large <= 2**30:
        raise SpecError(f"need 4 ≤ --small < --large ≤ 1 GiB, got {small} and {large}",
                        field="--large", fix="e.g. --small 8 --large 16MiB")
    emulate = None
    if args.emulate:
        emulate = load_cost_matrix(args.emulate)
        if emulate.n != args.nproc:
            raise SpecError(f"the matrix has {emulate.n} ranks, --nproc is {args.nproc}",
                            source=args.emulate, field="ranks", fix="make them equal")
    cm = run_probe(ProbeSettings(backend=args.backend, nproc=args.nproc, repeats=args.repeats,
                                 small_bytes=small, large_bytes=large, timeout_s=args.timeout),
                   emulate=emulate)
    text = cm.to_json()
    if args.out:
        atomic_write_text(args.out, text)
    if args.json:
        print(text, end="")
        return 0
    lat = cm.latency_s[~__import__("numpy").eye(cm.n, dtype=bool)]
    bw = cm.bandwidth_Bps[~__import__("numpy").eye(cm.n, dtype=bool)]
    print(f"probed {cm.n} ranks ({args.backend}) on {len(set(cm.hostnames))} host(s): latency "
          f"{format_time(float(lat.min()))} … {format_time(float(lat.max()))}, bandwidth "
          f"{bw.min() / 1e9:.2f} … {bw.max() / 1e9:.2f} GB/s"
          + (f"; wrote {args.out}" if args.out else ""))
    return 0
