"""A model saved under one Transformers release loads as remote code under another and computes the same.

    python -m tests.cross_version save DIR    # under the newest release: a tiny model, inputs, expected outputs
    python -m tests.cross_version check DIR   # under another release: load with trust_remote_code, without the
                                              # package importable, and compare logits and generate() outputs

`.ci/run` saves under the newest supported release and checks under the lowest.
"""

import os
import subprocess
import sys
from pathlib import Path

CHECK = """
import sys, torch
sys.modules["vaswani_hf"] = None  # only the checkpoint's own code
import transformers
from transformers import AutoModelForSeq2SeqLM
path = sys.argv[1]
model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
expected = torch.load(path + "/expected.pt", weights_only=True)
with torch.no_grad():
    logits = model(**expected["inputs"]).logits
torch.testing.assert_close(logits, expected["logits"])
for name, kwargs in (("beam", {}), ("greedy", {"num_beams": 1})):
    out = model.generate(input_ids=expected["inputs"]["input_ids"],
                         attention_mask=expected["inputs"]["attention_mask"], **kwargs)
    assert torch.equal(out, expected[name]), (name, out, expected[name])
print(f"saved under Transformers {expected['version']}, loaded as remote code under {transformers.__version__}: "
      "same logits, same beam and greedy outputs")
"""


def save(path: Path) -> None:
    import torch
    import transformers

    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny(output_bias=True)).eval()
    ids = torch.randint(4, 99, (3, 9))
    ids[:, -1] = 2
    mask = torch.ones_like(ids)
    ids[0, -3:], mask[0, -3:] = 0, 0
    inputs = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :6]}
    with torch.no_grad():
        logits = model(**inputs).logits
    expected = {"inputs": inputs, "logits": logits, "version": transformers.__version__,
                "beam": model.generate(input_ids=ids, attention_mask=mask),
                "greedy": model.generate(input_ids=ids, attention_mask=mask, num_beams=1)}  # fmt: skip
    model.save_pretrained(path)
    torch.save(expected, path / "expected.pt")


def check(path: Path) -> int:
    env = {**os.environ, "HF_HOME": str(path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", CHECK, str(path)], env=env, cwd=path).returncode


if __name__ == "__main__":
    mode, folder = sys.argv[1], Path(sys.argv[2]).resolve()
    if mode == "save":
        save(folder)
    else:
        sys.exit(check(folder))
