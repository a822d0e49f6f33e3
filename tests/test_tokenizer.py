"""Tests for keras_transformer.tokenizer: training, round trips, TF/TFLite, save/load."""

import hashlib
import io
import json
import re
import unicodedata

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer.data import text
from keras_transformer.data.tokenizer import (
    END_ID,
    PAD_ID,
    START_ID,
    UNK_ID,
    Tokenizer,
    TokenizerFileError,
    model_type,
    train_tokenizer,
)

SPLIT_FILES = ("train", "val", "test_2016_flickr")


def fixture_lines(directory, languages=("en", "de", "fr")):
    return [line for split in SPLIT_FILES for language in languages
            for line in text.read_lines(directory / f"{split}.{language}.gz")]


@pytest.fixture(scope="module")
def tokenizer(fixture_corpus_dir):
    return train_tokenizer(fixture_lines(fixture_corpus_dir), 400, verbose=False)


def decode(strings):
    return [text.decode("utf-8") for text in np.asarray(strings).reshape(-1)]


def test_reserved_ids_and_vocabulary_size(tokenizer):
    assert (PAD_ID, UNK_ID, START_ID, END_ID) == (0, 1, 2, 3)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert 100 < tokenizer.vocabulary_size <= 400


def test_small_corpus_gives_fewer_pieces_than_asked():
    small = train_tokenizer(["Ein Mann läuft.", "A man runs."] * 20, 1000, verbose=False)
    assert small.vocabulary_size < 100


def test_training_is_deterministic(tokenizer, fixture_corpus_dir):
    again = train_tokenizer(fixture_lines(fixture_corpus_dir), 400, verbose=False)
    assert again.model_proto == tokenizer.model_proto


def test_training_reports_progress(fixture_corpus_dir, caplog):
    caplog.set_level("INFO", "keras_transformer")
    train_tokenizer(fixture_lines(fixture_corpus_dir, ["en"]), 100)
    assert len(caplog.messages) == 2
    assert re.fullmatch(r"Training a SentencePiece vocabulary of up to 100 pieces on \d+ "
                        r"lines\.\.\.", caplog.messages[0])
    assert re.fullmatch(r"Trained \d+ pieces in \d+\.\d s\.", caplog.messages[1])


def test_bad_training_arguments_are_rejected():
    with pytest.raises(ValueError, match="every line is empty"):
        train_tokenizer(["", "  "], 100)
    with pytest.raises(ValueError, match="must exceed the 4 reserved ids"):
        train_tokenizer(["a b c"], 4)


def test_round_trip_on_fixture(tokenizer, fixture_corpus_dir):
    lines = fixture_lines(fixture_corpus_dir)
    ids = tokenizer.tokenize(tf.constant(lines))
    assert ids.dtype == tf.int32 and isinstance(ids, tf.RaggedTensor)
    assert int(tf.reduce_min(ids.flat_values)) > END_ID  # no START/END/PAD/UNK inside
    assert decode(tokenizer.detokenize(ids.to_tensor())) == lines


def test_round_trip_on_multi30k_gives_natural_text(multi30k_dir):
    # Trained on the lines it reads back, so that every character has a piece and the
    # test stays fast: what is checked is the detokenizer's spacing and characters.
    validation = [line for language in ("en", "de")
                  for line in text.read_lines(multi30k_dir / f"val.{language}.gz")]
    tokenizer = train_tokenizer(validation, 1000, verbose=False)
    round_trip = decode(tokenizer.detokenize(tokenizer.tokenize(validation).to_tensor()))
    # nmt_nfkc normalisation: NFKC, and runs of spaces collapse to one.
    expected = [" ".join(unicodedata.normalize("NFKC", line).split()) for line in validation]
    assert round_trip == expected
    assert sum(line != original for line, original in zip(expected, validation)) < 5
    assert any("ä" in line for line in round_trip) and any("ß" in line for line in round_trip)


def test_detokenize_stops_at_end_and_drops_start_and_padding(tokenizer):
    ids = tokenizer.tokenize(["Zwei Mädchen spielen Fußball!", "Un chien."]).to_list()
    model_output = tf.constant([
        [START_ID] + ids[0] + [END_ID] + ids[1] + [PAD_ID],
        [START_ID] + ids[1] + [END_ID, PAD_ID] + ids[0],
    ])
    assert decode(tokenizer.detokenize(model_output)) == [
        "Zwei Mädchen spielen Fußball!", "Un chien."]
    assert decode(tokenizer.detokenize(tf.constant([[END_ID] + ids[0]]))) == [""]


def test_detokenize_accepts_ragged_and_single_sequences(tokenizer):
    ids = tokenizer.tokenize(["Ein Mann.", "Une femme âgée nourrit des pigeons."])
    assert decode(tokenizer.detokenize(ids)) == ["Ein Mann.",
                                                 "Une femme âgée nourrit des pigeons."]
    single = tokenizer.detokenize(tf.constant(ids[0].numpy().tolist() + [END_ID, PAD_ID]))
    assert single.shape == () and single.numpy().decode() == "Ein Mann."


def test_unknown_characters_and_out_of_range_ids_read_as_unknown(tokenizer):
    ids = tokenizer.tokenize(["Ein 漢 Mann."])
    assert UNK_ID in ids.flat_values.numpy().tolist()
    out_of_range = tf.constant([[tokenizer.vocabulary_size + 5, -1]])
    assert decode(tokenizer.detokenize(out_of_range))[0].split() == ["⁇", "⁇"]


class Serving(tf.Module):
    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(self, strings):
        ids = self.tokenizer.tokenize(strings).to_tensor(default_value=PAD_ID)
        return {"ids": ids, "text": self.tokenizer.detokenize(ids)}


SENTENCES = ["Ein älterer Mann überquert eine belebte Straße.",
             "Un panneau indique « Fermé » en grandes lettres."]


def test_saved_model_round_trip_in_tf2_and_session_loaders(tokenizer, tmp_path):
    tf.saved_model.save(Serving(tokenizer), str(tmp_path))
    restored = tf.saved_model.load(str(tmp_path))
    assert decode(restored.round_trip(tf.constant(SENTENCES))["text"]) == SENTENCES
    # TF Serving and saved_model_cli use the session-based loader.
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(tmp_path))
        signature = meta_graph.signature_def["serving_default"]
        text = session.run(signature.outputs["text"].name,
                           {signature.inputs["strings"].name: SENTENCES})
    assert decode(text) == SENTENCES


# Rare and unknown pieces: characters the vocabulary never saw (CJK, emoji, Cyrillic),
# rare accents, digits, and NFKC look-alikes (full-width letters, a no-break space, a
# ligature), where a reloaded tokenizer could segment otherwise (tensorflow/text#1304).
RARE = ["Ein 漢字 Mann 😀 läuft.", "Ｆｕｌｌ-width Ｌｅｔｔｅｒｓ ﬁne.", "Zoë naïve façade œuvre.",
        "Москва 1234567 ąčę", "a\u00a0b \u200bc"]


def test_a_saved_and_reloaded_tokenizer_gives_the_same_ids_on_rare_pieces(tokenizer,
                                                                           tmp_path):
    expected = tokenizer.tokenize(tf.constant(RARE)).to_tensor(default_value=PAD_ID).numpy()
    assert UNK_ID in expected  # the unknown characters do reach <unk>
    tf.saved_model.save(Serving(tokenizer), str(tmp_path))
    restored = tf.saved_model.load(str(tmp_path))
    np.testing.assert_array_equal(restored.round_trip(tf.constant(RARE))["ids"].numpy(),
                                  expected)
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(tmp_path))
        signature = meta_graph.signature_def["serving_default"]
        ids = session.run(signature.outputs["ids"].name,
                          {signature.inputs["strings"].name: RARE})
    np.testing.assert_array_equal(ids, expected)
    # And SentencePiece itself, in Python, agrees with the TF ops on every line.
    assert [list(row[row != PAD_ID]) for row in expected] == [
        tokenizer._processor.encode_as_ids(line) for line in RARE]


def test_tflite_round_trip_with_builtins_and_tf_text_kernels(tokenizer):
    interpreter_module = pytest.importorskip("ai_edge_litert.interpreter")

    class StaticBatch(tf.Module):
        # TFLite needs a static batch size here (see Tokenizer.detokenize).
        @tf.function(input_signature=[tf.TensorSpec([len(SENTENCES)], tf.string)])
        def round_trip(self, strings):
            ids = tokenizer.tokenize(strings).to_tensor(default_value=PAD_ID)
            ids = tf.reshape(ids, [len(SENTENCES), -1])
            return {"text": tokenizer.detokenize(ids)}

    module = StaticBatch()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.round_trip.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.allow_custom_ops = True
    interpreter = interpreter_module.InterpreterWithCustomOps(
        custom_op_registerers=tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS,
        model_content=converter.convert())
    runner = interpreter.get_signature_runner()
    assert decode(runner(strings=np.array(SENTENCES))["text"]) == SENTENCES


def test_save_and_load_give_the_same_ids(tokenizer, tmp_path):
    tokenizer.save(tmp_path / "tokenizer")
    loaded = Tokenizer.load(tmp_path / "tokenizer")
    assert loaded.vocabulary_size == tokenizer.vocabulary_size
    assert loaded.tokenize(SENTENCES).to_list() == tokenizer.tokenize(SENTENCES).to_list()


def test_loading_truncated_model_names_the_file(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    model_file = tmp_path / "tokenizer.model"
    model_file.write_bytes(model_file.read_bytes()[:1000])
    with pytest.raises(TokenizerFileError, match=re.escape(str(model_file))):
        Tokenizer.load(tmp_path)


def test_loading_garbage_model_names_the_file(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    model_file = tmp_path / "tokenizer.model"
    model_file.write_bytes(b"not a model")
    metadata = json.loads((tmp_path / "tokenizer.json").read_text())
    metadata["sha256"] = hashlib.sha256(b"not a model").hexdigest()
    (tmp_path / "tokenizer.json").write_text(json.dumps(metadata))
    with pytest.raises(TokenizerFileError,
                       match=re.escape(str(model_file)) + ": not a valid SentencePiece"):
        Tokenizer.load(tmp_path)
    with pytest.raises(TokenizerFileError, match="model_proto: not a valid SentencePiece"):
        Tokenizer(b"not a model")


def _bpe_model(lines, model_type="bpe"):
    """A SentencePiece model (BPE unless `model_type` says) with the reserved ids that
    `Tokenizer` expects."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=400,
        hard_vocab_limit=False, model_type=model_type, pad_id=PAD_ID, unk_id=UNK_ID,
        bos_id=START_ID, eos_id=END_ID, pad_piece="<pad>", unk_piece="<unk>",
        bos_piece="<s>", eos_piece="</s>", num_threads=1, minloglevel=2)
    return model.getvalue()


def test_bpe_model_is_refused_because_the_fast_tokenizer_splits_it_otherwise(
        fixture_corpus_dir):
    lines = fixture_lines(fixture_corpus_dir)
    bpe = _bpe_model(lines)
    # Why the refusal: tf-text's kernel segments it unlike SentencePiece itself.
    by_sentencepiece = sentencepiece.SentencePieceProcessor(model_proto=bpe).encode(lines)
    by_tf_text = tensorflow_text.FastSentencepieceTokenizer(bpe).tokenize(lines).to_list()
    assert by_sentencepiece != by_tf_text
    with pytest.raises(TokenizerFileError, match="model_proto: a SentencePiece BPE model"):
        Tokenizer(bpe)


@pytest.mark.parametrize("serialized, expected", [
    (b"", "UNIGRAM"),  # no trainer_spec: the field's default
    (b"\x12\x02\x18\x02", "BPE"),  # trainer_spec { model_type: BPE }
    (b"\x12\x02\x18\x02\x12\x02\x18\x04", "CHAR"),  # given twice: merged, last wins
    (b"\x12\x00", "UNIGRAM"),  # an empty trainer_spec
])
def test_model_type_reads_the_wire_format_as_protobuf_does(serialized, expected):
    assert model_type(serialized) == expected
    proto = _sentencepiece_proto()
    if proto is not None:
        assert proto.TrainerSpec.ModelType.Name(
            proto.ModelProto.FromString(serialized).trainer_spec.model_type) == expected


@pytest.mark.parametrize("kind", ["unigram", "bpe", "char", "word"])
def test_model_type_agrees_with_sentencepieces_own_proto(fixture_corpus_dir, kind):
    proto = _sentencepiece_proto()
    if proto is None:
        pytest.skip("sentencepiece's generated proto does not import with this protobuf "
                    "(0.2.3's needs protobuf 7; the beam extra installs 6)")
    model = _bpe_model(fixture_lines(fixture_corpus_dir), model_type=kind)
    assert model_type(model) == proto.TrainerSpec.ModelType.Name(
        proto.ModelProto.FromString(model).trainer_spec.model_type) == kind.upper()


def _sentencepiece_proto():
    """sentencepiece's generated `sentencepiece_model_pb2`, or `None` where it does not
    import (the independent reference of `model_type`)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except Exception:  # noqa: BLE001  protobuf's VersionError, whose module varies
        return None
    return sentencepiece_model_pb2


def test_loading_corrupt_metadata_or_missing_files_names_the_file(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "tokenizer.json"))):
        Tokenizer.load(tmp_path)
    tokenizer.save(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"vocabulary_size": ')
    with pytest.raises(TokenizerFileError,
                       match=re.escape(str(tmp_path / "tokenizer.json")) + ": not valid JSON"):
        Tokenizer.load(tmp_path)


def test_nbest_segmentations_spell_the_line_most_likely_first(tokenizer, fixture_corpus_dir):
    lines = fixture_lines(fixture_corpus_dir, ("de",))[:50] + ["", "."]
    ids, log_probs = tokenizer.nbest_tokenize(lines, 8)
    assert ids.shape[0] == log_probs.shape[0] == len(lines)
    assert ids.row_lengths().numpy().tolist() == log_probs.row_lengths().numpy().tolist()
    best = tokenizer.tokenize(lines).to_list()
    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(tokenizer.model_proto)
    for line, segmentations, scores, most_likely in zip(
            lines, ids.to_list(), log_probs.to_list(), best):
        assert 1 <= len(segmentations) <= 8 and len(set(map(tuple, segmentations))) == len(
            segmentations)
        assert segmentations[0] == most_likely
        spelled = decode(tokenizer.detokenize(tf.ragged.constant(segmentations, tf.int32)))
        assert set(spelled) == {decode(tokenizer.detokenize([most_likely]))[0]}
        # SentencePiece's own score of each segmentation (its log-probability).
        reference = processor.nbest_encode_as_proto(line, nbest_size=8).nbests
        np.testing.assert_allclose(scores, [n.score for n in reference], rtol=1e-5,
                                   atol=1e-4)
        assert (np.diff(scores) <= 1e-4).all()  # most likely first (ties in float32)
    assert ids.to_list()[-2] == [[]]  # an empty line has one segmentation: no pieces
    with pytest.raises(ValueError, match="nbest must be at least 1"):
        tokenizer.nbest_tokenize(lines, 0)
