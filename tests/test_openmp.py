"""OpenMP's wait policy: a process that imports vaswani_hf before torch gets passive waiting threads, so that a
CPU-bound neighbour does not slow it 40-fold (vaswani_hf/openmp.py; docs/engines-performance.md, "Beside a neighbour"),
and a policy the user chose stays theirs."""

import os
import subprocess
import sys

import pytest

# Records OMP_WAIT_POLICY at the moment torch is first imported: libgomp reads it when torch loads it, so a value
# set afterwards would do nothing, and only the value seen then counts.
SPY = """
import importlib.abc, os, sys
seen = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY", "unset"))
        return None
sys.meta_path.insert(0, Spy())
{imports}
print(seen[0], os.environ.get("OMP_WAIT_POLICY", "unset"))
"""


def policy_at_torch_import(imports: str, **env: str) -> list[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", SPY.format(imports=imports)], env={**environment, **env},
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.split()


@pytest.mark.parametrize("env", [{}, {"OMP_WAIT_POLICY": ""}])
def test_importing_the_package_first_makes_waiting_threads_sleep(env):
    # the `vaswani` command's entry point (vaswani_hf.cli) imports the package first, so every command is covered;
    # an empty variable is no choice (libgomp reads it as unset, and would spin)
    assert policy_at_torch_import("import vaswani_hf", **env) == ["PASSIVE", "PASSIVE"]


@pytest.mark.parametrize("env", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}])
def test_a_policy_the_user_set_is_kept(env):
    seen = policy_at_torch_import("import vaswani_hf", **env)
    assert seen == [env.get("OMP_WAIT_POLICY", "unset")] * 2


def test_after_torch_the_package_sets_nothing_that_could_no_longer_take_effect():
    assert policy_at_torch_import("import torch, vaswani_hf") == ["unset", "unset"]
