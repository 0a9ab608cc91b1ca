"""Every bad input we know of, with the message it must produce (docs/troubleshooting.md lists the
same messages). Each case ends in a clear error naming the argument or file, never a stack trace from inside
torch and never silently changed data."""

import json

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.data.readers import load_split, read_parallel
from vaswani_hf.translation.inference import load_for_inference

from .helpers import TINY_RUN, broken_copy, vaswani

IDS = torch.tensor([[5, 6, 2]])

MODEL_INPUTS = {
    "token id above the vocabulary": (dict(input_ids=torch.tensor([[5, 200, 2]]), labels=IDS),
                                      r"`input_ids` holds token id 200, outside the vocabulary \[0, 99\)"),
    "negative token id": (dict(input_ids=torch.tensor([[5, -1, 2]]), labels=IDS), r"token id -1, outside"),
    "decoder id above the vocabulary": (dict(input_ids=IDS, decoder_input_ids=torch.tensor([[1, 500]])),
                                        r"`decoder_input_ids` holds token id 500"),
    "label above the vocabulary": (dict(input_ids=IDS, labels=torch.tensor([[5, 300]])),
                                   r"`labels` holds token id 300.*use -100 for positions to ignore"),
    "mask shape differs from ids": (dict(input_ids=IDS, attention_mask=torch.ones(1, 4), labels=IDS),
                                    r"`attention_mask` has shape \(1, 4\) but `input_ids` has .* \(1, 3\)"),
    "decoder mask shape differs": (dict(input_ids=IDS, decoder_input_ids=IDS, decoder_attention_mask=torch.ones(2, 3)),
                                   r"`decoder_attention_mask` has shape \(2, 3\)"),
    "empty batch": (dict(input_ids=torch.zeros(0, 3, dtype=torch.long), labels=IDS),
                    r"`input_ids` must be a non-empty batch .* got \(0, 3\)"),
    "zero-length sequence": (dict(input_ids=torch.zeros(1, 0, dtype=torch.long), labels=IDS),
                             r"non-empty batch .* got \(1, 0\)"),
    "float ids": (dict(input_ids=IDS.float(), labels=IDS), r"`input_ids` must hold integer token ids, got dtype"),
    "no decoder inputs and no labels": (dict(input_ids=IDS), r"no `decoder_input_ids`.*`labels`.*generate\(\)"),
}  # fmt: skip


@pytest.mark.parametrize("case", MODEL_INPUTS)
def test_bad_model_input(case):
    kwargs, message = MODEL_INPUTS[case]
    model = VaswaniForConditionalGeneration(VaswaniConfig.tiny()).eval()
    with pytest.raises(ValueError, match=message):
        model(**kwargs)


def test_learned_positions_have_a_limit_sinusoids_extend():
    long = torch.full((1, 80), 5)  # tiny: max_position_embeddings 64
    learned = VaswaniForConditionalGeneration(VaswaniConfig.tiny(position_embedding_type="learned")).eval()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        learned(input_ids=long, labels=IDS)
    sinusoidal = VaswaniForConditionalGeneration(VaswaniConfig.tiny()).eval()
    assert sinusoidal(input_ids=long, labels=IDS).logits.shape == (1, 3, 99)


CONFIGS = {
    "heads do not divide d_model": ({"d_model": 30, "encoder_attention_heads": 4}, "d_model"),
    "dropout above 1": ({"dropout": 1.5}, "dropout"),
    "unknown position type": ({"position_embedding_type": "rotary"}, "position_embedding_type"),
    "unknown norm position": ({"norm_position": "middle"}, "norm_position"),
}


@pytest.mark.parametrize("case", CONFIGS)
def test_bad_config_on_construction_and_on_load(case, tmp_path):
    fields, name = CONFIGS[case]
    with pytest.raises(StrictDataclassError, match=name):  # @strict validation, as Transformers' own configs
        VaswaniConfig.tiny(**fields)
    VaswaniConfig.tiny().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **fields}))
    with pytest.raises(StrictDataclassError, match=name):
        VaswaniConfig.from_pretrained(tmp_path)


CHECKPOINTS = {
    "no weights": r"has config.json but no model.safetensors: the save did not finish",
    "truncated weights": r"cannot read model.safetensors .* truncated or corrupt",
    "another model type": r"holds a 'bert' model, not a 'vaswani' one",
    "tokenizer larger than the model": r"the tokenizer has \d+ tokens but the model only 50",
    "not a model directory": r"is not a model directory \(no config.json\)",
}


@pytest.mark.parametrize("case", CHECKPOINTS)
def test_bad_checkpoint(case, trained, tmp_path):
    directory = (
        tmp_path / "empty" if case == "not a model directory" else broken_copy(trained[0], tmp_path / case, case)
    )
    directory.mkdir(exist_ok=True)
    with pytest.raises((ValueError, FileNotFoundError), match=CHECKPOINTS[case]):
        load_for_inference(directory)


DATA = {
    "mismatched line counts": ({"train.en": "a\nb\nc\n", "train.de": "x\ny\n"},
                               r"train.en has 3 lines but .*train.de has 2"),
    "non-UTF-8 bytes": ({"train.en": b"ok\nbad \xff\n", "train.de": "x\ny\n"}, r"train.en: line 2 is not valid UTF-8"),
    "empty files": ({"train.en": "", "train.de": ""}, r"holds no non-empty sentence pairs"),
    "tsv line without a tab": ({"train.tsv": "one\teins\ntwo zwei\n"}, r"train.tsv: line 2 has 1 tab-separated fields"),
    "jsonl line that is not JSON": ({"train.jsonl": '{"en": "a", "de": "b"}\n{oops\n'},
                                    r"train.jsonl: line 2 is not valid JSON"),
    "jsonl without the language": ({"train.jsonl": '{"en": "a", "fr": "b"}\n'},
                                   r"no 'en' and 'de' fields .* Check --src/--tgt"),
    "no such split": ({"val.en": "a\n", "val.de": "b\n"}, r"holds no train.en \+ train.de, train.tsv or train.jsonl"),
}  # fmt: skip


@pytest.mark.parametrize("case", DATA)
def test_bad_training_data(case, tmp_path):
    files, message = DATA[case]
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content, encoding="utf-8")
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_split(str(tmp_path), "train", "en", "de")


def test_a_dataset_column_that_does_not_exist(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n')
    with pytest.raises(ValueError, match=r"has columns \['source', 'target'\], but neither 'translation' nor 'en'"):
        load_split(str(tmp_path), "train", "en", "de", hub=True)


def test_empty_pairs_are_dropped_and_counted(tmp_path, caplog):
    (tmp_path / "train.en").write_text("a\n \nc\n")
    (tmp_path / "train.de").write_text("x\ny\n\n")
    assert read_parallel(tmp_path, "train", "en", "de") == [("a", "x")]
    assert "dropped 2 of 3 pairs with an empty side" in caplog.text


def test_cli_reports_data_errors_before_training(tmp_path):
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("x\n")
    result = vaswani("train", "--data", str(tmp_path), *TINY_RUN, "--eval_split", "none",
                     "--output_dir", str(tmp_path / "out"))  # fmt: skip
    # the message, not its position: a library's import-time noise on stderr (torchao's, say) is not our failure
    message = f"error: {tmp_path / 'train.en'} has 2 lines but {tmp_path / 'train.de'} has 1"
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()  # nothing was trained or written


def test_cli_refuses_to_mix_a_new_run_into_old_checkpoints(tmp_path):
    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    result = vaswani("train", *TINY_RUN, "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2 and "holds checkpoints of an earlier run" in result.stderr
    assert "--resume" in result.stderr and "--overwrite_output_dir" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["translate", "MODEL", "--num-beams", "0"],
        ["translate", "MODEL", "--nbest", "0"],
        ["translate", "MODEL", "--batch-size", "-1"],
        ["evaluate", "MODEL", "--num-beams", "two"],
        ["score", "MODEL", "--source", "s", "--target", "t", "--batch-size", "0"],
        ["attention", "MODEL", "a sentence", "--num-beams", "0"],
        ["average", "RUN", "--last", "0"],
    ],
)
def test_counts_below_one_are_refused_not_replaced_by_a_default(argv, capsys):
    from vaswani_hf.cli import main

    with pytest.raises(SystemExit) as stop:  # argparse's usage error, before any model is read
        main(argv)
    assert stop.value.code == 2
    option, value = argv[-2:]
    assert f"argument {option}: must be a whole number of at least 1, got {value!r}" in capsys.readouterr().err
