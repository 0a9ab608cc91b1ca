"""`vaswani` with rank 1's clock running 1,000 times fast (tests/test_distributed.py): its time limit passes after its
first update, rank 0's never. The ranks must still stop together, after the same update, with one checkpoint."""

import os
import sys
import time

from vaswani_hf import cli
from vaswani_hf.training import stopping

if os.environ.get("RANK") == "1":
    real = time.perf_counter

    class SkewedTime:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def perf_counter() -> float:
            return real() * 1000

    stopping.time = SkewedTime()

sys.exit(cli.main(sys.argv[1:]))
