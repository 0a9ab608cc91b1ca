"""The `vaswani` command end to end on tiny settings, and its error messages."""

import json
import os
import subprocess
import sys

import pytest

from vaswani_hf.data.number_words import english, german
from vaswani_hf.training.trainer import noam_learning_rate

from .helpers import LETTER_WORDS, TINY_RUN, forget_measured_ways, paper_model_folder, vaswani


def test_number_words_need_reordering():
    assert (english(21), german(21)) == ("twenty-one", "einundzwanzig")
    assert (english(101), german(101)) == ("one hundred one", "einhunderteins")
    assert (english(310), german(310)) == ("three hundred ten", "dreihundertzehn")


def test_noam_schedule_values():
    d_model, warmup = 512, 4000
    assert noam_learning_rate(1, d_model, warmup) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_learning_rate(warmup, d_model, warmup) == pytest.approx(512**-0.5 * 4000**-0.5)  # peak, 6.99e-4
    assert noam_learning_rate(4 * warmup, d_model, warmup) == pytest.approx(512**-0.5 * 16000**-0.5)


def test_train_builtin_task_summary(trained):
    out, stdout = trained
    summary = json.loads([line for line in stdout.splitlines() if line.startswith('{"')][-1])
    assert summary["steps"] == 4 and summary["model_dir"] == str(out)
    assert summary["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert summary["loss"] > 0  # the evaluation split's per-token loss: benchmarks/table3.py's perplexity
    if not os.environ.get("OMP_NUM_THREADS") and not os.environ.get("MKL_NUM_THREADS"):
        assert summary["threads"].startswith("1 ("), summary["threads"]  # the tiny preset, d_model 32 (or 1 core)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }


def test_a_narrow_model_trains_on_one_thread_and_a_user_s_count_is_kept(tmp_path):
    # the threads the training really ran on, read inside the run and at its card (the summary could say one thing
    # and the run do another); a thread started during the run, and the calling program after it, keep the program's
    # own count (3: neither one nor torch's default here)
    program = ("import sys, threading, torch; import vaswani_hf.training.recipe as recipe; inner = recipe.train\n"
               "def train(*args, **kwargs):\n    seen = []; other = threading.Thread(target=lambda: "
               "seen.append(torch.get_num_threads())); other.start(); other.join()\n"
               "    print('training on', torch.get_num_threads(), 'another thread on', seen[0])\n"
               "    return inner(*args, **kwargs)\n"
               "card = recipe.write_training_card\n"
               "def write_training_card(*args, **kwargs):\n    print('card on', torch.get_num_threads())\n"
               "    return card(*args, **kwargs)\n"
               "recipe.train, recipe.write_training_card = train, write_training_card\n"
               "torch.set_num_threads(3); from vaswani_hf.cli import main\n"
               "code = main(sys.argv[1:]); print('after', torch.get_num_threads()); sys.exit(code)")  # fmt: skip
    for chosen, expected in ((None, 1), ("3", 3)):
        environment = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS",
                                                                                      "MKL_NUM_THREADS")}  # fmt: skip
        if chosen:
            environment["OMP_NUM_THREADS"] = chosen
        result = subprocess.run([sys.executable, "-c", program, "train", *TINY_RUN, "--max_steps", "2",
                                 "--eval_split", "none", "--output_dir", str(tmp_path / str(chosen))],
                                capture_output=True, text=True, env=environment)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.splitlines()
        assert f"training on {expected} another thread on 3" in lines and lines[-1] == "after 3", lines
        assert f"card on {expected}" in lines  # the run's end, its card, on the run's count
        start = next(line for line in lines if line.startswith("task: "))
        summary = json.loads([line for line in lines if line.startswith('{"')][-1])
        assert summary["threads"].startswith(f"{expected} (") and start.endswith(f"threads {summary['threads']}")


def test_asking_the_builtin_task_for_averaging_writes_the_checkpoints(tmp_path):
    # the built-in task saves no checkpoints by default; --save_steps / --average_last ask for them
    result = vaswani("train", *TINY_RUN, "--save_steps", "2", "--average_last", "2", "--output_dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads([line for line in result.stdout.splitlines() if line.startswith('{"')][-1])
    assert summary["averaged"] == ["checkpoint-2", "checkpoint-4"]


def test_translate_from_stdin_keeps_line_count_and_order(trained):
    out, _ = trained
    result = vaswani("translate", str(out), "--num-beams", "1", stdin="seven\ntwenty-one , five\nninety\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.splitlines()) == 3


# What `vaswani translate` may import of this package: the command, the model and the translation loop. The rest
# (training, data preparation, scoring, serving, parsing, converters) and the libraries only they use would cost
# every start of the command (docs/engines-performance.md, "Start-up").
TRANSLATE_IMPORTS = ("vaswani_hf", "vaswani_hf.openmp", "vaswani_hf.cli", "vaswani_hf.cli_decoding", "vaswani_hf.data",
                     "vaswani_hf.data.encodings", "vaswani_hf.translation", "vaswani_hf.translation.inference",
                     "vaswani_hf.translation.source_lines", "vaswani_hf.translation.batch_workers",
                     "vaswani_hf.registration", "vaswani_hf.translation.light_translator",
                     "vaswani_hf.thread_counts")  # fmt: skip
NOT_FOR_TRANSLATE = ("datasets", "sacrebleu", "evaluate", "peft", "pyarrow", "matplotlib", "nltk", "onnxruntime",
                     "ctranslate2", "fastapi", "starlette", "uvicorn", "transformers.trainer", "transformers.pipelines",
                     "transformers.hf_argparser")  # fmt: skip


def test_translate_imports_only_what_it_translates_with(trained):
    out, _ = trained
    code = (f"import sys; from vaswani_hf.cli import main; assert main(['translate', {str(out)!r}]) == 0; "
            "print(*sorted(sys.modules), sep='\\n', file=sys.stderr)")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, input="seven\n")
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(result.stderr.splitlines())
    ours = {m for m in loaded if m.startswith("vaswani_hf") and not m.startswith("vaswani_hf.model")}
    assert ours <= set(TRANSLATE_IMPORTS), sorted(ours - set(TRANSLATE_IMPORTS))
    assert not loaded & set(NOT_FOR_TRANSLATE), sorted(loaded & set(NOT_FOR_TRANSLATE))
    assert len(result.stdout.splitlines()) == 1


def test_the_command_translates_one_batch_without_importing_transformers(tmp_path):
    """The light start (translation/light_translator.py, docs/engines-performance.md "Start-up"): `vaswani translate`
    of one batch through the command's entry point imports no Transformers module, and writes what the
    Transformers model writes (`VASWANI_LIGHT_START=0`)."""
    folder = paper_model_folder(tmp_path)
    code = ("import sys, vaswani_command; sys.argv = ['vaswani', 'translate', sys.argv[1], '--precision', 'fp32']; "
            "code = vaswani_command.main(); print(*sorted(sys.modules), sep='\\n', file=sys.stderr); "
            "sys.exit(code)")  # fmt: skip
    lines = "a b c\n\nd e f g h\n"
    light = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, input=lines)
    assert light.returncode == 0, light.stderr[-2000:]
    loaded = set(light.stderr.splitlines())
    assert not {m for m in loaded if m.split(".")[0] in ("transformers", "accelerate", "datasets")}
    full = vaswani("translate", str(folder), "--precision", "fp32", stdin=lines,
                   env={**os.environ, "VASWANI_LIGHT_START": "0"})  # fmt: skip
    assert full.returncode == 0, full.stderr[-2000:]
    assert light.stdout == full.stdout and len(light.stdout.splitlines()) == 3
    assert light.stderr.splitlines()[:2] == full.stderr.splitlines()[:1] + full.stderr.splitlines()[-1:]


@pytest.mark.parametrize("beams, precision", [("1", "fp32"), ("4", "fp32"), ("4", "int8")])
def test_the_command_translates_many_batches_and_windows_without_importing_transformers(tmp_path, beams, precision):
    """An input of several windows of several batches takes the light start too, its batches searched side by side
    (a model as wide as `batch_workers.MIN_D_MODEL`, one sentence a batch: the light start's workers at one row):
    no Transformers module loaded, the Transformers model's lines, and a line too long named by its number in the
    whole input (the third window's), after the lines before its window are written, as on the model's path."""
    folder = paper_model_folder(tmp_path / "wide", d_model=256, encoder_ffn_dim=256, decoder_ffn_dim=256,
                                model_max_length=12)  # fmt: skip
    lines = [" ".join(LETTER_WORDS[(i * 3 + k) % 40] for k in range(1 + i % 6)) for i in range(9)]
    lines[4] = ""
    code = ("import sys, vaswani_command; sys.argv = ['vaswani', 'translate', *sys.argv[1:]]; "
            "code = vaswani_command.main(); print(*sorted(sys.modules), sep='\\n', file=sys.stderr); "
            "sys.exit(code)")  # fmt: skip
    options = [str(folder), "--precision", precision, "--batch-size", "1", "--window", "4", "--num-beams", beams]
    for text, status in (("\n".join(lines) + "\n", 0), ("\n".join([*lines, " ".join(LETTER_WORDS[:30])]) + "\n", 2)):
        light = subprocess.run([sys.executable, "-c", code, *options, "--long-lines", "error"], capture_output=True,
                               text=True, input=text)  # fmt: skip
        assert light.returncode == status, light.stderr[-2000:]
        assert not {m for m in light.stderr.splitlines() if m.split(".")[0] in ("transformers", "accelerate")}
        full = vaswani("translate", *options, "--long-lines", "error", stdin=text,
                       env={**os.environ, "VASWANI_LIGHT_START": "0"})  # fmt: skip
        assert full.returncode == status, full.stderr[-2000:]
        assert light.stdout == full.stdout and len(light.stdout.splitlines()) == (9 if status == 0 else 8)
        if status:
            said = [line for line in light.stderr.splitlines() if "line 10" in line]
            assert said and said[-1] == full.stderr.splitlines()[-1], (light.stderr[-800:], full.stderr[-800:])


def test_the_light_start_says_the_precision_before_it_reads_a_line(tmp_path):
    """As the model's path: the precision line comes before any line is read, so input that stops the run (bad
    UTF-8) leaves the same stderr either way."""
    folder = paper_model_folder(tmp_path)
    runs = [subprocess.run([sys.executable, "-m", "vaswani_command", "translate", str(folder), "--precision", "fp32"],
                           input=b"a b\n\xff\xfe c\n", capture_output=True, env={**os.environ, **env})
            for env in ({}, {"VASWANI_LIGHT_START": "0"})]  # fmt: skip
    light, full = (run.stderr.decode().splitlines() for run in runs)
    assert runs[0].returncode == runs[1].returncode == 2
    assert light[0] == full[0] == "precision: fp32 (asked for); device: cpu", (light, full)
    assert light[-1] == full[-1] and "not UTF-8" in light[-1]


def test_a_user_who_asked_for_the_fast_products_gets_the_model_s_path(tmp_path):
    """`VASWANI_CPU_FAST_PATHS=1` is the user's choice (docs/decoding.md): the light start, which has no fast
    products, hands a one-batch input over; `=0` keeps it (the light start computes the model's own products)."""
    folder = paper_model_folder(tmp_path)
    # (fp32: `auto`'s first measurement on a machine builds the Transformers model to time it)
    code = ("import sys, vaswani_command; sys.argv = ['vaswani', 'translate', sys.argv[1], '--precision', 'fp32']; "
            "code = vaswani_command.main(); print('transformers' in sys.modules, file=sys.stderr); "
            "sys.exit(code)")  # fmt: skip
    for value, imported in (("1", "True"), ("0", "False")):
        result = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                                input="a b\n", env={**os.environ, "VASWANI_CPU_FAST_PATHS": value})  # fmt: skip
        assert result.returncode == 0 and result.stderr.splitlines()[-1] == imported, result.stderr[-2000:]


def test_a_closed_stdin_is_a_clear_error(tmp_path):
    folder = paper_model_folder(tmp_path)
    for env in ("", "VASWANI_LIGHT_START=0 "):
        result = subprocess.run(["sh", "-c", f"{env}{sys.executable} -m vaswani_command translate {folder} <&-"],
                                capture_output=True, text=True)  # fmt: skip
        assert result.returncode == 2 and "error: stdin is closed" in result.stderr, result.stderr[-2000:]


def test_a_greedy_search_given_a_length_penalty_says_what_the_model_says(tmp_path):
    """Transformers warns of a length penalty given to a greedy search: the light start hands such a run over."""
    folder = paper_model_folder(tmp_path)
    options = ["--precision", "fp32", "--num-beams", "1", "--length-penalty", "5"]
    runs = [vaswani("translate", str(folder), *options, stdin="a b c\n", env={**os.environ, **env})
            for env in ({}, {"VASWANI_LIGHT_START": "0"})]  # fmt: skip

    def said(stderr: str) -> list[str]:  # Transformers' progress bar of the weights aside
        return [line for line in stderr.splitlines() if "Loading weights" not in line]

    assert runs[0].stdout == runs[1].stdout and said(runs[0].stderr) == said(runs[1].stderr)


def test_a_program_calling_the_command_keeps_the_package_s_registration(tmp_path):
    """`vaswani_command.main([...])` called by a program (not the script) imports the package whole: what the
    program does next with Transformers' Auto classes knows the model."""
    folder = paper_model_folder(tmp_path)
    code = ("import sys, vaswani_command; assert vaswani_command.main(['translate', sys.argv[1]]) == 0; "
            "from transformers import AutoModelForSeq2SeqLM; from vaswani_hf.model import generation_vaswani; "
            "AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1]); "
            "assert generation_vaswani.SPEEDUPS.cpu_products is not None")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, input="a b\n")
    assert result.returncode == 0, result.stderr[-2000:]


def test_train_on_a_data_folder_and_evaluate(tmp_path, trained):
    data = tmp_path / "data"
    data.mkdir()
    for split, numbers in (("train", range(1, 200)), ("val", range(200, 220))):
        (data / f"{split}.en").write_text("\n".join(english(n) for n in numbers) + "\n", encoding="utf-8")
        (data / f"{split}.de").write_text("\n".join(german(n) for n in numbers) + "\n", encoding="utf-8")
    result = vaswani(
        "train", "--data", str(data), *TINY_RUN, "--bpe_dropout", "0.1", "--output_dir", str(tmp_path / "m")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BLEU" in result.stdout and "199 training pairs" in result.stdout
    result = vaswani("evaluate", str(trained[0]), "--data", str(data), "--split", "val", "--batch-size", "64",
                     "--precision", "int8")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["sentences"] == 20
    assert json.loads(result.stdout)["precision"] == "int8" and "precision: int8" in result.stderr


def test_evaluate_writes_the_hypotheses_translate_prints(tmp_path, trained):
    data = tmp_path / "data"
    data.mkdir()
    numbers = range(300, 306)
    (data / "test.en").write_text("\n".join(english(n) for n in numbers) + "\n", encoding="utf-8")
    (data / "test.de").write_text("\n".join(german(n) for n in numbers) + "\n", encoding="utf-8")
    hypotheses = tmp_path / "hyp.de"
    result = vaswani("evaluate", str(trained[0]), "--data", str(data), "--precision", "fp32", "--length-penalty",
                     "1.0", "--hypotheses", str(hypotheses))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    printed = vaswani("translate", str(trained[0]), "--input", str(data / "test.en"), "--precision", "fp32",
                      "--length-penalty", "1.0")  # fmt: skip
    assert hypotheses.read_text(encoding="utf-8").splitlines() == printed.stdout.splitlines()
    assert len(printed.stdout.splitlines()) == len(numbers)


def test_length_penalty_option_reaches_beam_search(trained):
    scores = {}
    for alpha in ("0.0", "2.0"):
        result = vaswani("translate", str(trained[0]), "--nbest", "2", "--length-penalty", alpha, "--precision",
                         "fp32", stdin="seven\n")  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        scores[alpha] = [float(line.rsplit("|||", 1)[1]) for line in result.stdout.splitlines()]
    assert scores["0.0"] != scores["2.0"]  # SCORE is the log-probability divided by GNMT's ((5 + |Y|) / 6) ** alpha


def test_translate_in_each_precision_keeps_the_lines(trained):
    for precision in ("fp32", "auto", "int8"):
        result = vaswani("translate", str(trained[0]), "--precision", precision, stdin="seven\nninety\n")
        assert result.returncode == 0, result.stderr[-2000:]
        assert len(result.stdout.splitlines()) == 2 and "precision: " in result.stderr


def test_bf16_on_a_cpu_without_it_is_a_clear_error(trained, monkeypatch, capsys):
    import torch

    from vaswani_hf.cli import main

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine, even beside a GPU
    for argv in (["translate", str(trained[0]), "--precision", "bf16"], ["train", "--precision", "bf16"],
                 ["train", "--bf16_weights"]):  # fmt: skip
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert "neither AMX-BF16 nor AVX512-BF16" in error and "--precision fp32" in error, error


def test_mismatched_line_counts_are_a_clear_error(tmp_path):
    (tmp_path / "train.en").write_text("a\nb\nc\n")
    (tmp_path / "train.de").write_text("x\ny\n")
    (tmp_path / "val.en").write_text("a\n")
    (tmp_path / "val.de").write_text("x\n")
    result = vaswani("train", "--data", str(tmp_path), *TINY_RUN, "--output_dir", str(tmp_path / "m"))
    assert result.returncode == 2
    assert "train.en has 3 lines but" in result.stderr and "train.de has 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_non_utf8_input_names_file_and_line(tmp_path):
    (tmp_path / "train.en").write_bytes(b"ok\nbad \xff byte\n")
    (tmp_path / "train.de").write_text("x\ny\n")
    result = vaswani("train", "--data", str(tmp_path), *TINY_RUN, "--eval_split", "none")
    assert result.returncode == 2 and "train.en: line 2 is not valid UTF-8" in result.stderr


def test_missing_model_directory_is_a_clear_error(tmp_path):
    result = vaswani("translate", str(tmp_path / "nope"), stdin="seven\n")
    assert result.returncode == 2 and "nope: no such folder; give a model folder saved by" in result.stderr


def test_translate_nbest_prints_moses_blocks_best_first(trained):
    out, _ = trained
    result = vaswani("translate", str(out), "--nbest", "3", stdin="seven\ntwenty-one\n")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 1, 1]  # one block of 3 per input line, in input order
    for block in (rows[:3], rows[3:]):
        scores = [float(r[2]) for r in block]
        assert scores == sorted(scores, reverse=True) and all(s <= 0 for s in scores)
    plain = vaswani("translate", str(out), stdin="seven\ntwenty-one\n").stdout.splitlines()
    assert plain == [rows[0][1], rows[3][1]]  # the 1-best of the n-best list is the plain translation


def test_score_is_the_forced_decoding_log_probability(trained, tmp_path):
    import torch

    from vaswani_hf.translation.inference import load_for_inference

    out, _ = trained
    (tmp_path / "src").write_text("seven\ntwenty-one , five\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("sieben\neinundzwanzig , fünf\n", encoding="utf-8")
    result = vaswani("score", str(out), "--source", str(tmp_path / "src"), "--target", str(tmp_path / "tgt"))
    assert result.returncode == 0, result.stderr[-2000:]
    scored = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(scored) == 2
    # against the model's own per-token probabilities, one sentence at a time without padding
    model, tokenizer = load_for_inference(out)
    labels = tokenizer(text_target="einundzwanzig , fünf", return_tensors="pt")["input_ids"]
    source = tokenizer("twenty-one , five", return_tensors="pt").to(model.device)
    labels = labels.to(model.device)
    with torch.no_grad():
        logits = model(**source, labels=labels).logits
    expected = torch.log_softmax(logits, -1)[0].gather(-1, labels[0][:, None])[:, 0].cpu()
    assert scored[1]["tokens"] == labels.shape[1] and scored[1]["token_strings"][-1] == tokenizer.eos_token
    torch.testing.assert_close(torch.tensor(scored[1]["token_log_probs"]), expected, atol=1e-4, rtol=0)
    assert abs(scored[1]["log_prob"] - float(expected.sum())) < 1e-3
    mismatched = tmp_path / "short"
    mismatched.write_text("sieben\n", encoding="utf-8")
    result = vaswani("score", str(out), "--source", str(tmp_path / "src"), "--target", str(mismatched))
    assert result.returncode == 2 and "must be aligned" in result.stderr


def test_translate_streams_a_file_in_windows_and_token_batches(tmp_path, trained):
    # windows of 7 lines, batches of at most 20 padded tokens: the same lines, in the same order, as one window
    from vaswani_hf.data.number_words import english

    lines = [english(n) + (" , " + english(n * 7 % 997) if n % 3 else "") for n in range(1, 41)]
    source = tmp_path / "in.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    whole = vaswani("translate", str(trained[0]), "--input", str(source), "--precision", "fp32", "--nbest", "2")
    small = vaswani("translate", str(trained[0]), "--input", str(source), "--precision", "fp32", "--nbest", "2",
                    "--window", "7", "--max-tokens", "20", "--batch-size", "5")  # fmt: skip
    assert whole.returncode == 0 and small.returncode == 0, small.stderr[-2000:]
    assert len(whole.stdout.splitlines()) == 2 * len(lines)
    for ours, theirs in zip(small.stdout.splitlines(), whole.stdout.splitlines(), strict=True):
        assert ours.split(" ||| ")[:2] == theirs.split(" ||| ")[:2]
        # other batch neighbours, other padding: the same sums in another order
        assert float(ours.split(" ||| ")[2]) == pytest.approx(float(theirs.split(" ||| ")[2]), abs=1e-4)


def test_translate_stream_reads_one_window_before_it_answers(trained):
    # a million-line file never sits in memory: the first results come after `window` lines were read
    from vaswani_hf.translation.inference import load_for_inference, translate_stream

    model, tokenizer = load_for_inference(trained[0], device="cpu")
    pulled = []

    def endless():
        while True:
            pulled.append(1)
            yield "seven"

    results = translate_stream(model, tokenizer, endless(), window=5, num_beams=1)
    assert [next(results) for _ in range(7)] and len(pulled) == 10


def test_a_one_batch_input_is_decoded_without_timing_ways(trained, monkeypatch):
    """A whole input of one batch decodes with the model's own products, the same tokens, and no stopwatch trial (it
    cannot pay for itself within one search); an input of several batches still times the fast products' ways."""
    from vaswani_hf.model.speed import fast_products
    from vaswani_hf.translation.inference import load_for_inference, translate_nbest, translate_stream

    model, tokenizer = load_for_inference(trained[0], device="cpu")
    lines = ["seven", "twenty-one , five", "ninety"]
    forget_measured_ways(monkeypatch)
    one_batch = list(translate_stream(model, tokenizer, iter(lines)))
    assert not fast_products._LINEAR_TRIALS and not fast_products._FASTEST_LINEAR
    assert not fast_products._FASTEST_PRODUCT and not fast_products._OUTPUT_TRIALS
    assert one_batch == translate_nbest(model, tokenizer, lines, progress=False, cpu_fast_paths=False)
    several = list(translate_stream(model, tokenizer, iter(lines), batch_size=1))
    assert fast_products._LINEAR_TRIALS or fast_products._FASTEST_LINEAR
    assert [c[0][0] for c in several] == [c[0][0] for c in one_batch]


def test_a_one_batch_input_keeps_the_users_fast_paths_setting(trained, monkeypatch):
    """`VASWANI_CPU_FAST_PATHS=1` is the user's choice: a one-batch input then times the fast products' ways too."""
    from vaswani_hf.model.speed import fast_products
    from vaswani_hf.translation.inference import load_for_inference, translate_stream

    model, tokenizer = load_for_inference(trained[0], device="cpu")
    forget_measured_ways(monkeypatch)
    monkeypatch.setenv("VASWANI_CPU_FAST_PATHS", "1")
    list(translate_stream(model, tokenizer, iter(["seven", "ninety"])))
    assert fast_products._LINEAR_TRIALS or fast_products._FASTEST_LINEAR


def test_translate_names_the_line_that_is_not_utf8(tmp_path, trained):
    source = tmp_path / "in.en"
    source.write_bytes(b"seven\nninety\ntwenty \xff one\n")
    result = vaswani("translate", str(trained[0]), "--input", str(source))
    assert result.returncode == 2 and "not UTF-8 text (line 3, byte 7)" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
