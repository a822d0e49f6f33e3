"""Smoke tests of the benchmark scripts: each runs at a tiny size and writes valid JSON.

They check that the scripts work and that what they write is consistent, not speed.
"""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import (
    bleu_callback_time,
    checkpoint_averaging,
    cold_start,
    common,
    decode_engines,
    decode_step_ops,
    decode_throughput,
    length_penalty,
    loss_step,
    mfu,
    models,
    portable_greedy,
    train_throughput,
)
from keras_transformer import files
from keras_transformer.data import text

TINY_MODEL = ["--vocabulary-size", "300", "--num-layers", "1", "--hidden-dim", "16",
              "--intermediate-dim", "32", "--num-heads", "2", "--max-length", "32"]


def _run(main, arguments, tmp_path):
    path = tmp_path / "result.json"
    main([*TINY_MODEL, *arguments, "--json", str(path)])
    result = json.loads(path.read_text())
    assert result["machine"]["cores"] >= 1 and len(result["load_average_start"]) == 3
    return result


def test_a_repeated_list_option_adds_its_values_and_the_first_replaces_the_default():
    assert length_penalty.parse_arguments(["run"]).alphas == [0.6, 1.0, 1.5, 2.0]
    assert length_penalty.parse_arguments(["run", "--alphas", "0.8"]).alphas == [0.8]
    repeated = length_penalty.parse_arguments(
        ["run", "--alphas", "0.6", "1.0", "--alphas", "1.5"])
    assert repeated.alphas == [0.6, 1.0, 1.5]
    assert length_penalty.parse_arguments(["run"]).alphas == [0.6, 1.0, 1.5, 2.0]
    assert decode_throughput.parse_arguments(
        ["--batch-sizes", "1", "--batch-sizes", "8"]).batch_sizes == [1, 8]
    with pytest.raises(SystemExit):  # values are still checked against the choices
        decode_throughput.parse_arguments(["--decoders", "cached", "--decoders", "nope"])


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="needs Linux's /proc/cpuinfo")
def test_machine_records_the_cpu_family_model_and_vector_extensions():
    with open("/proc/cpuinfo", encoding="utf-8") as file:
        first_cpu = file.read().split("\n\n")[0]

    def field(name):
        match = re.search(rf"^{name}\s*:\s*(.*)$", first_cpu, re.MULTILINE)
        return match and match.group(1).strip()

    facts = common.machine()
    assert facts["cpu"] == field("model name")
    assert (facts["cpu_family"], facts["cpu_model"]) == (field("cpu family"), field("model"))
    flags = (field("flags") or "").split()
    assert facts["cpu_features"] == [name for name in common.CPU_FEATURES if name in flags]


def test_describe_cpu_names_avx512_and_reads_results_that_predate_it():
    facts = {"cpu": "AMD EPYC", "cores": 2, "cpu_family": "25", "cpu_model": "17",
             "cpu_features": ["avx2", "avx512f", "avx512_bf16"]}
    assert common.describe_cpu(facts) == "AMD EPYC (family 25, model 17, AVX-512 bf16), 2 cores"
    assert common.describe_cpu({**facts, "cpu_model": "1", "cpu_features": ["avx2"]}) == (
        "AMD EPYC (family 25, model 1, no AVX-512), 2 cores")
    assert common.describe_cpu({"cpu": "Intel(R) Xeon(R)", "cores": 2}) == (
        "Intel(R) Xeon(R), 2 cores")


def test_keras_hub_baseline_has_our_size():
    arguments = train_throughput.parse_arguments(TINY_MODEL)
    ours = models.build_ours(arguments, 300)
    keras_hub = models.build_keras_hub(arguments, 300)
    # Equal, but for keras-hub's learned positions (max_length × hidden_dim).
    assert keras_hub.count_params() - ours.count_params() == 32 * 16


@pytest.mark.slow
def test_train_throughput_times_one_model(tmp_path):
    result = _run(train_throughput.main, [
        "--model", "keras_hub", "--batch-tokens", "256", "--num-pairs", "200",
        "--warmup-batches", "1", "--steps", "2"], tmp_path)
    assert result["model"] == "keras_hub"
    assert result["tokens_per_second"] > 0 and result["target_tokens"] > 0
    assert result["peak_rss_mb"] >= result["rss_before_model_mb"] > 0


MFU_TINY_MODEL = ["vocabulary_size=300", "num_layers=1", "hidden_dim=16",
                  "intermediate_dim=32", "num_heads=2"]


@pytest.mark.slow
def test_mfu_counts_model_flops_and_divides_by_the_peak(tmp_path):
    path = tmp_path / "mfu.json"
    mfu.main(["--preset", "paper_base", *MFU_TINY_MODEL, "batch_tokens=64", "--length", "8",
              "--variants", "float32", "float32+fused", "--warmup-batches", "1",
              "--steps", "2", "--repeats", "1", "--peak-tflops", "2", "--json", str(path)])
    result = json.loads(path.read_text())
    assert [row["variant"] for row in result["rows"]] == ["float32", "float32+fused"]
    # Every weight matrix a token passes, counted from the model itself: ×2 FLOPs per
    # multiply-add, ×3 for the backward pass; the tied embedding once more as the
    # output projection. Source and target have the same length here.
    from keras_transformer.model import Transformer
    model = Transformer(300, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2)
    matrices = sum(int(np.prod(weight.shape)) for weight in model.weights
                   if len(weight.shape) == 2)  # the embedding is (V, D)
    # Attention per layer and sentence of 8: encoder self 8·8, decoder self 8·8 and
    # cross 8·8 query-key pairs, each D multiply-adds for the score and D for the value.
    attention = 3 * 2 * (3 * 8 * 8 * 2 * 16) / 8
    assert result["model_flops_per_target_token"] == pytest.approx(6 * matrices + attention)
    for row in result["rows"]:
        assert row["batch"] == "8×8" and row["parameters"] == model.count_params()
        assert row["tokens_per_second"] == pytest.approx(64 / (row["step_ms"] / 1e3))
        assert row["mfu"] == pytest.approx(
            row["tokens_per_second"] * result["model_flops_per_target_token"] / 2e12)


def test_mfu_refuses_overrides_after_the_variants():
    with pytest.raises(SystemExit):
        mfu.parse_arguments(["--variants", "float32", "batch_tokens=64"])


@pytest.mark.slow
def test_train_throughput_compares_both_models_on_the_same_batches(tmp_path):
    result = _run(train_throughput.main, [
        "--batch-tokens", "256", "--num-pairs", "200", "--warmup-batches", "1",
        "--steps", "2", "--memory-steps", "1"], tmp_path)
    rows = {row["model"]: row for row in result["rows"]}
    assert set(rows) == {"ours", "keras_hub"}
    assert rows["ours"]["target_tokens"] == rows["keras_hub"]["target_tokens"]
    for row in rows.values():
        assert row["peak_rss_mb"] >= row["rss_before_model_mb"] > 0
        assert row["alone_tokens_per_second"] > 0
    assert result["ours_over_keras_hub"] == pytest.approx(
        rows["ours"]["tokens_per_second"] / rows["keras_hub"]["tokens_per_second"])
    assert result["median_step_ratio"] > 0


def _check_decoding(result, decoders, batch_sizes, output_length):
    rows = result["rows"]
    assert [(row["decoder"], row["batch"]) for row in rows] == [
        (decoder, batch) for batch in batch_sizes for decoder in decoders]
    for row in rows:
        assert row["mean_output_length"] == output_length  # END never wins
        assert row["tokens_per_second"] > 0
        if row["decoder"] not in decode_throughput.NOT_COMPARED:
            assert row["same_as_cached"]
    speed = {(row["decoder"], row["batch"]): row["tokens_per_second"] for row in rows}
    expected = {f"{fast}_over_{reference}_batch_{batch}": speed[(fast, batch)] / speed[
        (reference, batch)] for fast, reference in decode_throughput.RATIOS
        for batch in batch_sizes if fast in decoders and reference in decoders}
    assert expected and result["ratios"] == pytest.approx(expected)


@pytest.mark.slow
def test_decode_throughput_forces_the_output_length(tmp_path):
    # The exported decoders: the slow test and cold start.
    decoders = ["cached", "uncached", "cached_xla"]
    result = _run(decode_throughput.main, [
        "--decoders", *decoders, "--batch-sizes", "1", "3", "--output-length", "4",
        "--calls", "1"], tmp_path)
    _check_decoding(result, decoders, [1, 3], 4)


@pytest.mark.slow
def test_decode_throughput_runs_every_decoder(tmp_path):
    result = _run(decode_throughput.main, [
        "--batch-sizes", "2", "--output-length", "4", "--calls", "1"], tmp_path)
    _check_decoding(result, list(decode_throughput.DECODERS), [2], 4)


@pytest.mark.slow
def test_portable_greedy_loops_decode_as_the_shipped_decoder_and_time_every_batch(tmp_path):
    path = tmp_path / "greedy.json"
    portable_greedy.main(["--preset", "paper_base", *MFU_TINY_MODEL, "--variants", "float32",
                          "--batch-sizes", "1", "3", "--source-length", "6",
                          "--output-length", "5", "--calls", "1", "--json", str(path)])
    result = json.loads(path.read_text())
    rows = result["rows"]
    assert [(row["batch"], row["decoder"]) for row in rows] == [
        (1, "cached"), (1, "uncached"), (3, "cached"), (3, "uncached")]
    for row in rows:
        assert row["same_as_cached"] is True
        assert row["tokens_per_second"] == pytest.approx(
            row["batch"] * 5 / row["seconds_per_call"])
    speed = {(row["batch"], row["decoder"]): row["tokens_per_second"] for row in rows}
    assert result["cached_over_uncached"] == pytest.approx({
        f"float32_batch_{batch}": speed[(batch, "cached")] / speed[(batch, "uncached")]
        for batch in (1, 3)})

    # The keras.ops loop against the shipped TensorFlow decoder, END forbidden in both.
    from keras_transformer import config as config_lib
    from keras_transformer import decoding
    model_config = config_lib.override(config_lib.preset_config("paper_base"),
                                       MFU_TINY_MODEL).model
    model = portable_greedy.build(model_config, "float32")
    sources = portable_greedy.random_sources(model_config.vocabulary_size, 3, 6, seed=1)
    expected = decoding.greedy_decode(decode_throughput.EndlessModel(model), sources,
                                      max_length=5, extra_length=None).ids.numpy()
    assert expected.shape == (3, 5) and np.all(expected >= common.FIRST_ORDINARY_ID)
    for decoder in ("cached", "uncached"):
        ids = portable_greedy.compiled_greedy(model, 5, decoder)(sources).numpy()
        np.testing.assert_array_equal(ids, expected, err_msg=decoder)


@pytest.mark.slow
def test_cold_start_times_a_fresh_process_per_artifact(tmp_path):
    result = _run(cold_start.main, ["--runs", "1", "--output-length", "4"], tmp_path)
    rows = {row["artifact"]: row for row in result["rows"]}
    assert sorted(rows) == ["saved_model", "tflite"]
    for name, row in rows.items():
        assert 0 < row["open_s"] < row["start_to_first_translation_s"] <= row[
            "process_total_s"]
        assert result["median"][name]["start_to_first_translation_s"] == row[
            "start_to_first_translation_s"]
    # The .tflite file is translated without TensorFlow's Python package.
    assert rows["saved_model"]["tensorflow_imported"]
    assert not rows["tflite"]["tensorflow_imported"]


def test_logsumexp_loss_matches_ours(tmp_path):
    path = tmp_path / "loss.json"
    loss_step.main(["--batch", "3", "--length", "4", "--vocabulary-size", "11",
                    "--calls", "1", "--json", str(path)])
    result = json.loads(path.read_text())
    ours, logsumexp = result["rows"]
    assert logsumexp["value"] == pytest.approx(ours["value"], rel=1e-6)
    assert result["max_gradient_difference"] < 1e-6


def test_decode_step_ops_times_every_variant(tmp_path):
    path = tmp_path / "ops.json"
    decode_step_ops.main(["--batch", "2", "--cache-length", "4", "--hidden-dim", "8",
                          "--num-heads", "2", "--vocabulary-size", "10", "--steps", "3",
                          "--calls", "1", "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 10 and all(row["ms_per_step"] > 0 for row in rows)


def _untrained_run(tmp_path, fixture_corpus_dir):
    """A run directory of the tiny preset on the fixture corpus, with untrained weights."""
    import dataclasses

    import keras

    from keras_transformer import config as config_lib
    from keras_transformer import runs
    from keras_transformer.data.tokenizer import train_tokenizer

    run_dir = tmp_path / "run"
    preset = config_lib.preset_config("tiny")
    run_config = dataclasses.replace(
        preset, data=dataclasses.replace(preset.data, data_dir=str(fixture_corpus_dir)))
    lines = text.read_lines(fixture_corpus_dir / "train.en.gz")
    tokenizer = train_tokenizer(lines + text.read_lines(fixture_corpus_dir / "train.de.gz"),
                                run_config.model.vocabulary_size, verbose=False)
    run_config = dataclasses.replace(run_config, model=dataclasses.replace(
        run_config.model, vocabulary_size=tokenizer.vocabulary_size, num_layers=1))
    run_dir.mkdir()
    run_config.save(str(run_dir / files.CONFIG))
    tokenizer.save(str(run_dir / files.TOKENIZER))
    keras.utils.set_random_seed(0)
    runs.build_model(run_config).save_weights(str(run_dir / files.FINAL_WEIGHTS))
    return run_dir


@pytest.mark.slow
def test_bleu_callback_time_translates_alike_with_and_without_xla(tmp_path,
                                                                   fixture_corpus_dir):
    run_dir = _untrained_run(tmp_path, fixture_corpus_dir)
    path = tmp_path / "result.json"
    bleu_callback_time.main([str(run_dir), "--sentences", "4", "--repeats", "1",
                             "--json", str(path)])
    result = json.loads(path.read_text())
    assert [row["mode"] for row in result["rows"]] == ["graph", "xla"]
    assert result["same_translations"]
    assert result["graph_over_xla"] == pytest.approx(
        result["rows"][0]["median_seconds"] / result["rows"][1]["median_seconds"])


@pytest.mark.slow
def test_length_penalty_scores_each_alpha_with_sacrebleu(tmp_path, fixture_corpus_dir):
    from keras_transformer import runs
    from keras_transformer.data import corpus
    from keras_transformer.serving import translator as translator_lib

    run_dir = _untrained_run(tmp_path, fixture_corpus_dir)
    path = tmp_path / "result.json"
    length_penalty.main([str(run_dir), "--weights", "final", "--alphas", "0", "2",
                         "--sentences", "3", "--json", str(path)])
    result = json.loads(path.read_text())
    assert [row["alpha"] for row in result["rows"]] == [0.0, 2.0]

    # Each row is sacreBLEU on the exported graph's beam search with that α: chrF and
    # BLEU's line (n-gram precisions, hypothesis length) depend on every character.
    run_config, tokenizer, model = runs.load_run(str(run_dir), "final")
    sources, references = (text.read_lines(path)[:3]
                           for path in corpus.corpus_files(run_config.data, "validation"))
    for row in result["rows"]:
        translator = translator_lib.Translator(model, tokenizer, length_penalty=row["alpha"])
        _assert_scores_beam_search(row, translator, sources, references)
        assert row["chrf"] > 0


def _assert_scores_beam_search(row, translator, sources, references):
    """Asserts that `row` holds sacreBLEU's scores of `translator`'s beam search."""
    import sacrebleu

    outputs = translator.translate_beam(tf.constant(sources))["translations"].numpy()
    hypotheses = [text.decode() for text in outputs]
    bleu = sacrebleu.metrics.BLEU()
    assert row["bleu_text"] == bleu.corpus_score(hypotheses, [references]).format(
        signature=str(bleu.get_signature()))
    assert row["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)


@pytest.mark.slow
def test_checkpoint_averaging_scores_the_mean_of_the_newest_checkpoints(tmp_path,
                                                                        fixture_corpus_dir):
    import keras
    import numpy as np

    from keras_transformer import runs
    from keras_transformer.data import corpus
    from keras_transformer.serving import translator as translator_lib

    run_dir = _untrained_run(tmp_path, fixture_corpus_dir)
    run_config, tokenizer, model = runs.load_run(str(run_dir), "final")
    checkpoint_dir = run_dir / files.CHECKPOINTS
    checkpoint_dir.mkdir()
    saved = {}
    for seed, step in enumerate([10, 20, 30]):
        keras.utils.set_random_seed(seed)
        fresh = runs.build_model(run_config)
        fresh.save_weights(str(checkpoint_dir / f"step-{step:08d}.weights.h5"))
        saved[step] = fresh.get_weights()
    fresh.save_weights(str(checkpoint_dir / "best.weights.h5"))
    (checkpoint_dir / "best.json").write_text(json.dumps(
        {"bleu": 1.5, "step": 30, "epoch": 1, "sentences": 2}))

    path = tmp_path / "result.json"
    checkpoint_averaging.main([str(run_dir), "--counts", "1", "2", "--sentences", "3",
                               "--json", str(path)])
    result = json.loads(path.read_text())
    assert [row["checkpoints"] for row in result["rows"]] == [
        ["step-00000030.weights.h5"],
        ["step-00000020.weights.h5", "step-00000030.weights.h5"],
        ["best.weights.h5"]]
    assert "steps 20–30" in result["rows"][1]["weights"]

    # Each row is sacreBLEU on the beam search of the weights it names, averaged here
    # with NumPy and decoded without XLA.
    sources, references = (text.read_lines(path)[:3]
                           for path in corpus.corpus_files(run_config.data, "validation"))
    expected_weights = [saved[30], [np.mean(pair, axis=0) for pair in zip(saved[20], saved[30])],
                        saved[30]]
    for row, weights in zip(result["rows"], expected_weights):
        model.set_weights(weights)
        _assert_scores_beam_search(row, translator_lib.Translator(model, tokenizer), sources,
                                   references)
    # The averaged weights translate differently from the last checkpoint's.
    assert result["rows"][0]["chrf"] != result["rows"][1]["chrf"]


def test_checkpoint_averaging_refuses_more_checkpoints_than_the_run_kept(tmp_path,
                                                                         fixture_corpus_dir):

    run_dir = _untrained_run(tmp_path, fixture_corpus_dir)
    with pytest.raises(FileNotFoundError, match="No checkpoints"):
        checkpoint_averaging.weight_sets(str(run_dir))
    (run_dir / files.CHECKPOINTS).mkdir()
    (run_dir / files.CHECKPOINTS / "step-00000010.weights.h5").write_bytes(b"")
    with pytest.raises(ValueError, match="between 1 and the 1 checkpoints"):
        checkpoint_averaging.weight_sets(str(run_dir), [2])


def test_mfu_sums_gpu_kernel_time_per_step_by_family(tmp_path):
    import gzip
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "name": "loop_add_fusion", "dur": 999.0},  # host: not counted
        {"ph": "X", "pid": 7, "name": "loop_add_fusion_3", "dur": 100.0},
        {"ph": "X", "pid": 7, "name": "loop_add_fusion_12", "dur": 300.0},
        {"ph": "X", "pid": 7, "name": "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", "dur": 2000.0},
        {"ph": "X", "pid": 7, "name": "gemm_fusion_dot.4", "dur": 1000.0},
    ]
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as file:
        json.dump({"traceEvents": events}, file)
    kernels = mfu.device_kernel_times(str(tmp_path), steps=2, top=2)
    assert kernels["kernel_ms_per_step"] == pytest.approx(3.4 / 2)
    assert kernels["categories"] == pytest.approx({"matmul": 1.5, "element-wise fusion": 0.2})
    assert kernels["kernels"] == [
        {"kernel": "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", "category": "matmul",
         "ms": 1.0, "calls": 0.5},
        {"kernel": "gemm_fusion_dot", "category": "matmul", "ms": 0.5, "calls": 0.5}]
    assert [mfu.kernel_category(name) for name in (
        "input_reduce_fusion", "loop_transpose_fusion", "fusion", "MemcpyD2D")] == [
        "reduction fusion", "transpose", "other fusion", "other"]
    assert mfu.device_kernel_times(str(tmp_path / "empty"), steps=1) is None


@pytest.mark.parametrize("order", ["sorted", "input"])
def test_decode_engines_runs_every_batch_on_each_runner_in_turn(order):
    # Stub runners that "translate" a sentence to its reversed text, with token ids
    # whose count is the sentence's length: each must see the same batches, the first
    # of them rotating, and give back its translations in input order.
    calls = []

    def runner(name):
        def translate(batch):
            calls.append((name, tuple(batch)))
            lengths = [len(sentence) for sentence in batch]
            ids = np.zeros([len(batch), max(lengths) + 1], np.int32)  # PAD after
            for row, length in enumerate(lengths):
                ids[row, :length] = 7
            return {"translations": np.array([s[::-1].encode() for s in batch]),
                    "token_ids": ids}
        return translate

    sentences = ["a" * (n % 7 + 1) + str(n) for n in range(11)]
    results = decode_engines.translate_interleaved(
        {"x": runner("x"), "y": runner("y")}, sentences, 4, order)
    timed = calls[2:]  # after one warm-up call each
    assert [name for name, _ in timed] == ["x", "y", "y", "x", "x", "y"]
    assert [batch for _, batch in timed[0::2]] == [batch for _, batch in timed[1::2]]
    for seconds, tokens, texts in results.values():
        assert seconds > 0
        assert tokens == sum(map(len, sentences))
        assert texts == [sentence[::-1] for sentence in sentences]


@pytest.mark.slow
def test_serve_load_answers_every_request_hostile_one_and_fault(tmp_path, fixture_corpus_dir):
    from benchmarks import serve_load
    from tests.export_helpers import tiny_export

    exported = tiny_export()
    path = tmp_path / "serve.json"
    serve_load.main(["--artifact", exported.tflite_quantized, "--source",
                     str(fixture_corpus_dir / "val.en.gz"), "--sentences", "20",
                     "--clients", "1", "4", "--seconds", "1", "--hostile", "--faults",
                     "--json", str(path)])
    result = json.loads(path.read_text())
    assert [row["clients"] for row in result["load"]] == [1, 4]
    assert all(row["answered"] > 0 and row["errors"] == 0 for row in result["load"])
    assert result["offline"][exported.tflite_quantized] > 0
    assert all(row["ok"] for row in result["hostile"]), result["hostile"]
    faults = result["faults"]
    assert faults["restart_first_status"] == 200
    assert faults["sigterm_answered"] + faults["sigterm_not_accepted"] == faults[
        "sigterm_requests"] and faults["sigterm_answered"] > 0


@pytest.mark.parametrize("preset, variants", [
    ("multi30k", ["rdrop_alpha=5", "mixed_precision=bfloat16", "token_dropout=0"]),
    ("tiny", ["rdrop_alpha=5", "mixed_precision=bfloat16"])])  # no word dropout to remove
def test_regularization_cost_defaults_to_the_options_the_preset_lacks(preset, variants):
    from benchmarks import regularization_cost
    configs = regularization_cost.variant_configs(
        regularization_cost.parse_arguments(["--preset", preset]))
    assert list(configs) == ["preset", *variants]


@pytest.mark.slow
def test_regularization_cost_times_every_variant_on_the_same_batches(tmp_path):
    from benchmarks import regularization_cost
    path = tmp_path / "result.json"
    regularization_cost.main([
        "--preset", "tiny", "--num-pairs", "200", "--warmup-batches", "1", "--steps", "2",
        "--variant", "rdrop_alpha=1", "--variant", "token_dropout=0.2,dropout=0.2",
        "--json", str(path), "batch_tokens=256"])
    result = json.loads(path.read_text())
    rows = {row["variant"]: row for row in result["rows"]}
    assert list(rows) == ["preset", "rdrop_alpha=1", "token_dropout=0.2,dropout=0.2"]
    assert rows["preset"]["median_step_ratio"] == 1.0
    assert all(row["median_step_seconds"] > 0 for row in rows.values())
    assert len({row["parameters"] for row in rows.values()}) == 1  # same model size
    assert result["batch_tokens"] == 256
