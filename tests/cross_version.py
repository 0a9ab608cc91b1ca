"""A model saved under one Transformers release loads as remote code under another and computes the same.

    python -m tests.cross_version save DIR    # under the newest release: a tiny model and its expected outputs
    python -m tests.cross_version check DIR   # under another release: load with trust_remote_code, without the
                                              # package importable, and compare logits and generate() outputs

`.ci/run` saves under the newest supported release and checks under the lowest.
"""

import sys
from pathlib import Path

import torch
import transformers

from .helpers import remote_code_outputs


def save(path: Path) -> None:
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


def check(path: Path) -> None:
    expected = torch.load(path / "expected.pt", weights_only=True)
    remote = remote_code_outputs(path, expected["inputs"])
    torch.testing.assert_close(remote["logits"], expected["logits"])
    for name in ("beam", "greedy"):
        assert torch.equal(remote[name], expected[name]), (name, remote[name], expected[name])
    print(f"saved under Transformers {expected['version']}, loaded as remote code under {transformers.__version__}: "
          "same logits, same beam and greedy outputs")  # fmt: skip


if __name__ == "__main__":
    mode, folder = sys.argv[1], Path(sys.argv[2]).resolve()
    if mode == "save":
        save(folder)
    else:
        check(folder)
