"""FSDP2 on CPU processes (gloo): the model shards into the units `scripts/accelerate/fsdp-8gpu.yaml` names, trains,
and its gathered weights equal those of one process trained on the whole batch; they save and load.

Accelerate runs FSDP on GPUs only (on CPU, `VaswaniTrainingArguments` stops with an error rather than let it fall
back to DDP), so this drives torch's `fully_shard` directly, as Accelerate's FSDP2 plugin does.

    torchrun --nproc_per_node 2 -m tests.fsdp_cpu OUTPUT_DIR
"""

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

CONFIG = Path(__file__).parents[1] / "scripts" / "accelerate" / "fsdp-8gpu.yaml"


def train_step(model: torch.nn.Module, source: torch.Tensor, labels: torch.Tensor) -> None:
    # SGD: the update is the gradient, so a wrongly reduced one shows (Adam's first step is about lr * sign(g))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(input_ids=source, labels=labels).loss.backward()
    optimizer.step()


def main(output_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp = yaml.safe_load(CONFIG.read_text())["fsdp_config"]
    assert fsdp["fsdp_version"] == 2, fsdp
    wrap = set(fsdp["fsdp_transformer_layer_cls_to_wrap"].split(","))
    torch.manual_seed(0)
    config = VaswaniConfig.tiny(dropout=0.0)
    model = VaswaniForConditionalGeneration(config)
    reference = copy.deepcopy(model)
    initial = {name: value.clone() for name, value in reference.state_dict().items()}
    units = [m for m in model.modules() if type(m).__name__ in wrap]
    assert len(units) == config.encoder_layers + config.decoder_layers, f"{wrap} wraps {len(units)} modules"
    for unit in units:
        fully_shard(unit)
    fully_shard(model)
    assert type(next(model.parameters())).__name__ == "DTensor"

    # the same batch on every process; each trains on its share (equal lengths: the mean of means is the mean)
    source = torch.randint(4, config.vocab_size, (2 * world, 7), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(4, config.vocab_size, (2 * world, 5), generator=torch.Generator().manual_seed(2))
    share = slice(2 * rank, 2 * rank + 2)
    train_step(model, source[share], labels[share])
    train_step(reference, source, labels)

    gathered = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        expected = reference.state_dict()
        for name, value in gathered.items():
            torch.testing.assert_close(value, expected[name], atol=2e-5, rtol=1e-4, msg=name)
        assert all(not torch.equal(gathered[n], initial[n]) for n in gathered if "embed_positions" not in n)
        loaded = VaswaniForConditionalGeneration(config)
        loaded.load_state_dict(gathered)
        loaded.save_pretrained(output_dir)
        again = VaswaniForConditionalGeneration.from_pretrained(output_dir).eval()
        with torch.no_grad():
            logits = again(input_ids=source, labels=labels).logits
            torch.testing.assert_close(logits, reference.eval()(input_ids=source, labels=labels).logits)
        print(f"FSDP2 OK: {len(units)} units, {world} processes, {len(gathered)} tensors gathered", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
