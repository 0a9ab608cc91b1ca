"""Fetch Transformers' own common model tests for the installed version, at test time.

The sdist of the pinned Transformers release ships `tests/test_modeling_common.py` and
`tests/test_configuration_common.py` but not the helper modules they import; we extract the two files into the
git-ignored `tests/_upstream/` package and add minimal stand-ins for the rest (generation tests are ours).
Nothing here is committed: the files are Transformers' and are fetched with pip.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import transformers

UPSTREAM = Path(__file__).parent / "_upstream"
FILES = ("tests/test_modeling_common.py", "tests/test_configuration_common.py")
STANDINS = {
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    # A few of the common kwargs every config must accept and keep (upstream's list is longer).
    "utils/test_configuration_utils.py": (
        "config_common_kwargs = {\n"
        "    'return_dict': False,\n"
        "    'output_hidden_states': True,\n"
        "    'chunk_size_feed_forward': 5,\n"
        "    'architectures': ['BertModel'],\n"
        "    'id2label': {0: 'label'},\n"
        "    'label2id': {'label': '0'},\n"
        "    'problem_type': 'regression',\n"
        "}\n"
    ),
}


class UpstreamUnavailable(RuntimeError):
    """The upstream tests could not be fetched (a machine without access to the package index)."""


def ensure_upstream_tests() -> Path:
    """Download (once per Transformers version) and unpack the upstream common tests; return their folder."""
    UPSTREAM.mkdir(exist_ok=True)
    with open(UPSTREAM.parent / "_upstream.lock", "w") as lock:
        # each pytest-xdist worker imports this at collection: one fetches and writes, the others wait for it
        # rather than read a file the first is rewriting
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _fetch_upstream_tests()


def _fetch_upstream_tests() -> Path:
    version = transformers.__version__
    stamp = UPSTREAM / "VERSION"
    if stamp.is_file() and stamp.read_text() == version:
        return UPSTREAM
    with tempfile.TemporaryDirectory() as tmp:
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"transformers=={version}", "--no-binary", ":all:",
             "--no-deps", "--no-build-isolation", "-q", "-d", tmp],
            capture_output=True, text=True,
        )  # fmt: skip
        if fetched.returncode != 0:
            raise UpstreamUnavailable(f"pip could not fetch the sdist of transformers=={version} (no network to the "
                                      f"package index?): {fetched.stderr.strip()[-300:]}")  # fmt: skip
        archive = next(Path(tmp).glob("transformers-*.tar.gz"))
        with tarfile.open(archive) as tar:
            for relative in FILES:
                member = tar.getmember(f"transformers-{version}/{relative}")
                (UPSTREAM / Path(relative).name).parent.mkdir(parents=True, exist_ok=True)
                (UPSTREAM / Path(relative).name).write_bytes(tar.extractfile(member).read())
    for relative, text in STANDINS.items():
        path = UPSTREAM / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        (path.parent / "__init__.py").touch()
    (UPSTREAM / "__init__.py").touch()
    stamp.write_text(version)
    return UPSTREAM
