"""`vaswani` with a data preparation made slower than `--ddp_timeout`, recording when each process enters a
collective (tests/test_distributed.py): a rank that waits for another's preparation must wait on the file lock,
never in a collective that the process group's timeout could end."""

import json
import os
import sys
import time

import torch.distributed
import torch.distributed.distributed_c10d

from vaswani_hf import cli
from vaswani_hf.data import preparation

LOG = os.environ["VASWANI_TEST_LOG"]
DELAY = float(os.environ["VASWANI_TEST_PREPARE_SECONDS"])
COLLECTIVES = ("barrier", "monitored_barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object",
               "broadcast_object_list", "gather", "gather_object", "reduce", "scatter", "all_to_all")  # fmt: skip


def record(event: str) -> None:
    with open(LOG, "a") as log:
        log.write(json.dumps({"rank": os.environ.get("RANK"), "event": event, "time": time.time()}) + "\n")


def recorded(name: str, real):
    def collective(*args, **kwargs):
        record(name)
        return real(*args, **kwargs)

    return collective


build = preparation._build_training


def slow_build(*args, **kwargs):
    record("preparing")
    time.sleep(DELAY)
    build(*args, **kwargs)
    record("prepared")


preparation._build_training = slow_build
for module in (torch.distributed, torch.distributed.distributed_c10d):
    for name in COLLECTIVES:
        if hasattr(module, name):
            setattr(module, name, recorded(name, getattr(module, name)))

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
