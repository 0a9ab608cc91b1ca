"""OpenMP's wait policy for a process that imports vaswani_hf before torch: waiting threads sleep at once
(`OMP_WAIT_POLICY=PASSIVE`) instead of spinning, unless the user set the policy (or `GOMP_SPINCOUNT`) already.

Why: torch's CPU wheel runs its threads on libgomp, whose waiting threads spin for 300,000 rounds before they sleep.
Beside another CPU-bound process (a second translate, a training run, CTranslate2) each of the thousands of
parallel regions of a decoding run then waits for a thread the scheduler has parked, and spins while it waits:
on 2 cores of an AMD EPYC (Zen 3) greedy decoding of 32 sentences took 40x its quiet time beside one training
process (6.9 s against 0.17 s a call), 1.4x with the policy passive. Quiet, the passive policy costs about 8% at
batch 32 and, since the decoder steps without module calls, a fifth to a quarter at batch 1 greedy, where every
operator wakes the other thread (docs/engines-performance.md, "Beside a neighbour"): the smaller loss. libgomp
reads the variable once, when torch loads it, so it has to be set before `import torch`: a program that imports
torch first keeps OpenMP's default and can set the variable itself.
"""

import os
import sys

WAIT_POLICY = "PASSIVE"


def wait_passively() -> None:
    """Set `OMP_WAIT_POLICY=PASSIVE` for this process and its children, where it still takes effect and the user
    chose nothing (`OMP_WAIT_POLICY=ACTIVE`, or any `GOMP_SPINCOUNT`, keeps theirs; an empty value, which libgomp
    reads as unset, is no choice)."""
    if "torch" in sys.modules or os.environ.get("OMP_WAIT_POLICY") or os.environ.get("GOMP_SPINCOUNT"):
        return
    os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
