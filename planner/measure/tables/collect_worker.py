"""One rank of the straggler all-to-all measurement (run as a subprocess by collect.py).

``python comm_worker.py RANK WORLD PORT JOBS.json OUT.jsonl``: every job is
``{"sample_id", "dim_sums", "sleeps_ms", "local_batch", "warmup", "repeats"}``. Per iteration:
barrier; the rank sleeps its straggler delay, then runs the forward pooled-embedding
all-to-all (rank i sends ``local_batch_j × dim_sums[i]`` fp32 values to rank j), and its
forward time is the time from the barrier to the end of the all-to-all minus its own sleep
(NeuroShard's definition: the wait for slower ranks counts); after another barrier the
backward all-to-all (the transpose) is timed alone. Medians go to OUT, one JSON line per job.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from planner.measure.runner import init_group


def main(rank: int, world: int, rdzv: str, jobs_path: str, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    init_group("gloo", rank, world, rdzv, 120.0)
    jobs = json.load(open(jobs_path))
    with open(out_path, "a") as out:
        for job in jobs:
            dims = [int(x) for x in job["dim_sums"]]
            lb = [int(x) for x in job["local_batch"]]
            send = [lb[j] * dims[rank] for j in range(world)]
            recv = [lb[rank] * dims[i] for i in range(world)]
            fin, fout = torch.ones(sum(send)), torch.empty(sum(recv))
            bin_, bout = torch.ones(sum(recv)), torch.empty(sum(send))
            sleep_s = float(job["sleeps_ms"][rank]) / 1e3
            fw, bw = [], []
            for it in range(int(job["warmup"]) + int(job["repeats"])):
                dist.barrier()
                t0 = time.perf_counter()
                if sleep_s > 0:
                    time.sleep(sleep_s)
                dist.all_to_all_single(fout, fin, output_split_sizes=recv,
                                       input_split_sizes=send)
                t1 = time.perf_counter()
                dist.barrier()
                t2 = time.perf_counter()
                dist.all_to_all_single(bout, bin_, output_split_sizes=send,
                                       input_split_sizes=recv)
                t3 = time.perf_counter()
                if it >= int(job["warmup"]):
                    fw.append(max(0.0, t1 - t0 - sleep_s))
                    bw.append(t3 - t2)
            out.write(json.dumps({"sample_id": job["sample_id"], "rank": rank,
                                  "fwd_ms": 1e3 * statistics.median(fw),
                                  "bwd_ms": 1e3 * statistics.median(bw)}) + "\n")
            out.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
