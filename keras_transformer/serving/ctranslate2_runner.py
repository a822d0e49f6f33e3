"""Run a CTranslate2 export (`export --ctranslate2`) as the exported signatures run.

Imports CTranslate2 and SentencePiece only, never TensorFlow or the model code; called
like the other runtimes' runners (`runners.open_runner` opens a CTranslate2 directory
with it).
"""

import os

import numpy as np

from keras_transformer import files
from keras_transformer.files import (
    ALIGN_SIGNATURE,
    BEAM_SIGNATURE,
    GREEDY_SIGNATURE,
    N_BEST_SIGNATURE,
    PREFIX_SIGNATURE,
    SAMPLE_SIGNATURE,
    SCORE_SIGNATURE,
)
from keras_transformer.serving import artifacts
from keras_transformer.serving.signature_io import (
    MissingSignatureError,
    signature_inputs,
)

# CTranslate2's intra-op threads unless asked: the fastest on a 2-core CPU in
# `benchmarks/decode_engines.py` (BENCHMARKS.md).
CTRANSLATE2_DEFAULT_THREADS = 1


class CTranslate2Runner:
    """Translates with a CTranslate2 model directory written by `export --ctranslate2`.

    Imports CTranslate2 and SentencePiece only. Tokenizes with the run's SentencePiece
    model beside the weights, truncates and limits as the exported translator does
    (`translator.json`), and returns the outputs of the exported signatures: token ids
    with END where one was emitted, padded with PAD, and scores, the sum of the tokens'
    log-probabilities. PAD may never be chosen, as in the exported translator, which
    keeps PAD's share of each softmax while CTranslate2 takes it out: after label
    smoothing that share is about 0.1/V per token, so scores differ in the third digit.
    A sentence without a piece translates to the empty string (ids `[END]`, score 0)
    without a call.

    `n_best` calls `translate_batch` with `num_hypotheses`; CTranslate2 ranks by its
    own length penalty, `log P / length ** α`, not GNMT's `((5 + length) / 6) ** α`
    of the exported beam search, so lists may be ordered differently; their
    `normalized_scores` are CTranslate2's, their `scores` the log-probabilities
    (`score_batch` of each hypothesis). `score` calls `score_batch`, whose softmax is
    the model's whole one, as the exported `score`'s. `prefix` passes `target_prefix`
    to the exported beam search. `sample` passes `sampling_topk` and
    `sampling_temperature`, seeding CTranslate2's own generator
    (`ctranslate2.set_random_seed`) once per distinct seed and length limit of a call,
    so its draws differ from the exported ones and depend on the sentences called
    together; the same call repeats them. A call decodes its sentences together up to
    the longest of their length limits (source length + `extra_length`, capped), then
    again, at their own limit, those whose output ran past it: greedy outputs are each
    sentence's alone; a beam search still searching at a sentence's limit but ending
    with shorter hypotheses (a rare repetition loop) may differ from one stopped there.
    `align` takes the beam search's translations and their `return_attention` from a
    second, forced one-beam search (see `_forced_attention`): the export set the layer
    and averages all its heads, as the exported `align`; CTranslate2 gives no weights
    for START and END, whose columns are 0. Where the scores would be CTranslate2's own
    (`prefix`, `sample`), they are `score_batch`'s.

    Args:
        directory: str. The CTranslate2 model directory.
        beam: bool. Beam search with the exported beam size and α instead of greedy.
        threads: int or `None`. CTranslate2's intra-op threads; `None`: one (see
            `CTRANSLATE2_DEFAULT_THREADS`).
        signature: str or `None`: which signature's outputs to give, instead of
            `beam`'s (`files.SIGNATURES`).
    """

    def __init__(self, directory, beam=False, threads=None, signature=None):
        import ctranslate2  # here: see SavedModelRunner
        import sentencepiece

        directory = os.fspath(directory)
        self.options = artifacts.exported_options(directory)  # names a damaged file
        self._processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(directory, files.TOKENIZER_MODEL))
        self._translator = ctranslate2.Translator(
            directory, device="cpu", inter_threads=1,
            intra_threads=threads or CTRANSLATE2_DEFAULT_THREADS)
        self._ctranslate2 = ctranslate2
        self.signature = signature or (BEAM_SIGNATURE if beam else GREEDY_SIGNATURE)
        if self.signature not in held_signatures(self.options):
            raise MissingSignatureError(
                f"{directory} has no signature {self.signature!r} (it was exported before "
                "there was one): export the run again (keras-transformer export RUN_DIR "
                "--ctranslate2).")
        searching = self.signature in (BEAM_SIGNATURE, N_BEST_SIGNATURE, PREFIX_SIGNATURE,
                                       ALIGN_SIGNATURE)
        self._beam_size = self.options["beam_size"] if searching else 1
        self._length_penalty = self.options["length_penalty"] if searching else 0.0
        self._hypotheses = (self.options.get("n_best", min(4, self._beam_size))
                            if self.signature == N_BEST_SIGNATURE else 1)
        # The reserved ids as the SentencePiece model records them (`data.tokenizer`
        # imports TensorFlow, which this runner must not).
        self._pad_id, self._end_id = self._processor.pad_id(), self._processor.eos_id()
        self._pad = self._processor.id_to_piece(self._pad_id)

    def __call__(self, sentences, second=None):
        inputs = signature_inputs(self.signature, sentences, second)  # checks `second`
        texts = [_text(s) for s in sentences]
        pieces = self._encode(texts)
        if self.signature == SCORE_SIGNATURE:
            return self._score(pieces, [_text(t) for t in second])
        prefixes = (self._encode([_text(p) for p in second])
                    if self.signature == PREFIX_SIGNATURE else None)
        seeds = inputs.get(files.SEEDS_INPUT)
        rows, scores = self._translate(pieces, prefixes, seeds)
        if self.signature != N_BEST_SIGNATURE:
            rows = [hypotheses[0] for hypotheses in rows]
            outputs = {"translations": self._texts(rows),
                       "token_ids": _padded(rows, self._pad_id),
                       "scores": np.array([row[0] for row in scores], np.float32)}
            if self.signature in (PREFIX_SIGNATURE, SAMPLE_SIGNATURE):
                outputs["scores"] = self._score_ids(
                    pieces, [[row] for row in rows]).reshape([len(rows)])
            if self.signature == ALIGN_SIGNATURE:
                outputs.update(self._alignments(pieces, rows,
                                                self._forced_attention(pieces, rows)))
            return outputs
        # Fillers as the exported n_best's: empty, scored FORBIDDEN_SCORE.
        count = self._hypotheses
        rows = [hypotheses + [[]] * (count - len(hypotheses)) for hypotheses in rows]
        flat = [row for hypotheses in rows for row in hypotheses]
        log_probs = self._score_ids(pieces, rows)
        normalized = np.full([len(texts), count], files.FORBIDDEN_SCORE, np.float32)
        for i, row in enumerate(scores):
            # An empty source's one hypothesis, END, was not searched: its length
            # penalty is 1 in both conventions.
            normalized[i, :len(row)] = row if pieces[i] else log_probs[i, :1]
        token_ids = _padded(flat, self._pad_id).reshape([len(texts), count, -1])
        return {"translations": self._texts(flat).reshape([len(texts), count]),
                "token_ids": token_ids, "scores": np.where(
                    normalized == files.FORBIDDEN_SCORE, normalized, log_probs),
                "normalized_scores": normalized}

    def _encode(self, texts):
        """Each text's piece ids, cut so that START and END (added by CTranslate2,
        `add_source_bos/eos`) fit too."""
        return [ids[:self.options["max_source_length"] - 2]
                for ids in self._processor.encode(texts)]

    def _translate(self, pieces, prefixes=None, seeds=None):
        """Returns each sentence's hypotheses (id lists) and CTranslate2's scores."""
        limits = [self._limit(len(ids) + 2) for ids in pieces]
        rows = [[[self._end_id]] for _ in pieces]
        scores = [[0.0] for _ in pieces]
        # An empty source without a prefix translates to END alone, as exported.
        searched = [i for i, ids in enumerate(pieces) if ids or (prefixes and prefixes[i])]
        # One call per seed (after seeding CTranslate2) at the longest limit of its
        # sentences, then one per limit for the sentences whose output ran past their
        # own: cut to it, a hypothesis would keep the scores of the tokens cut off.
        # (Splitting every batch by limit decoded beam search at 0.70x the speed.)
        pending = {}
        for i in searched:
            seed = None if seeds is None else int(seeds[i]) % 2**32
            pending.setdefault((seed, None), []).append(i)
        while pending:
            (seed, limit), group = pending.popitem()
            results = self._translate_group(
                [pieces[i] for i in group],
                [prefixes[i] for i in group] if prefixes is not None else None,
                seed, limit or max(limits[i] for i in group))
            for i, result in zip(group, results):
                hypotheses = [[self._processor.piece_to_id(piece) for piece in hypothesis]
                              for hypothesis in result.hypotheses]
                if limit is None and max(map(len, hypotheses)) > limits[i]:
                    pending.setdefault((seed, limits[i]), []).append(i)
                else:
                    rows[i], scores[i] = hypotheses, list(result.scores)
        return rows, scores

    def _translate_group(self, pieces, prefixes, seed, limit):
        """CTranslate2's results for `pieces` (id lists) decoded with at most `limit`
        output tokens (END included): beam search, or sampling seeded with `seed`."""
        options = dict(beam_size=self._beam_size, length_penalty=self._length_penalty,
                       num_hypotheses=self._hypotheses)
        if seed is not None:
            self._ctranslate2.set_random_seed(seed)
            options = dict(beam_size=1, sampling_topk=self.options["sampling_top_k"],
                           sampling_temperature=self.options["sampling_temperature"])
        if prefixes is not None:
            options["target_prefix"] = [self._pieces(prefix) or None for prefix in prefixes]
        return self._translator.translate_batch(
            [self._pieces(ids) for ids in pieces], max_decoding_length=limit,
            min_decoding_length=1, max_input_length=0, return_end_token=True,
            return_scores=True, suppress_sequences=[[self._pad]], **options)

    def _forced_attention(self, pieces, rows):
        """The attention of each of `rows` after `pieces`, decoded again as the target
        prefix of a one-beam search (`None` for an empty source).

        CTranslate2's beam search (beam size 2 or more) returns other weights for the
        first target token than the same hypothesis decoded alone (later rows agree):
        the chosen hypotheses are decoded again, forced, where its weights are the
        model's.
        """
        attention = [None] * len(rows)
        group = [i for i, ids in enumerate(pieces) if ids]
        if not group:
            return attention
        # The weights of a row do not depend on the token chosen there: the last row
        # (END, or the limit's token) is free to differ.
        results = self._translator.translate_batch(
            [self._pieces(pieces[i]) for i in group],
            target_prefix=[self._pieces(rows[i][:-1]) or None for i in group],
            max_decoding_length=max(len(rows[i]) for i in group), min_decoding_length=1,
            max_input_length=0, return_end_token=True, return_attention=True,
            beam_size=1, suppress_sequences=[[self._pad]])
        for i, result in zip(group, results):
            attention[i] = result.attention[0][:len(rows[i])]
        return attention

    def _alignments(self, pieces, rows, attention):
        """The `align` signature's alignment outputs (`decoding.alignment`'s rules)."""
        sources = [[self._processor.bos_id(), *ids, self._end_id] for ids in pieces]
        source_words = _word_indices(sources, self._word_starts(), self._special_ids())
        target_words = _word_indices(rows, self._word_starts(), self._special_ids())
        weights = np.zeros([len(rows), target_words.shape[1], source_words.shape[1]],
                           np.float32)
        for i, matrix in enumerate(attention):
            if matrix:  # an empty source has none
                # CTranslate2 gives the weights of the pieces alone, not of the START
                # and END it adds: those columns stay 0.
                matrix = np.asarray(matrix, np.float32)
                weights[i, :matrix.shape[0], 1:1 + matrix.shape[1]] = matrix
        masked = np.where(source_words[:, None, :] >= 0, weights, -1.0)
        aligned = np.take_along_axis(source_words, masked.argmax(axis=-1), axis=1)
        return {"attention": weights, "source_words": source_words,
                "target_words": target_words,
                "alignments": np.where(target_words >= 0, aligned, -1).astype(np.int32)}

    def _word_starts(self):
        if not hasattr(self, "_starts"):
            self._starts = np.array([self._processor.id_to_piece(i).startswith("\u2581")
                                     for i in range(self._processor.get_piece_size())])
        return self._starts

    def _special_ids(self):
        return (self._pad_id, self._processor.bos_id(), self._end_id)

    def _score(self, pieces, translations):
        """The `score` signature's outputs of `translations` after `pieces`."""
        targets = [ids[:self.options["max_source_length"] - 2] + [self._end_id]
                   for ids in self._processor.encode(translations)]
        results = self._score_results(pieces, targets)
        token_scores = _padded([result.log_probs for result in results], 0.0, np.float32)
        token_ids = _padded(targets, self._pad_id)
        # Bytes, "" at padding, as the exported signature gives them.
        tokens = np.array([[self._processor.id_to_piece(int(i)).encode("utf-8")
                            if i != self._pad_id else b"" for i in row]
                           for row in token_ids], dtype=object).reshape(token_ids.shape)
        return {"scores": token_scores.sum(axis=1), "token_scores": token_scores,
                "token_ids": token_ids, "tokens": tokens}

    def _score_ids(self, pieces, rows):
        """Log-probabilities `(B, n)` of each sentence's hypotheses (id lists)."""
        sources = [source for source, hypotheses in zip(pieces, rows) for _ in hypotheses]
        targets = [row if row else [self._end_id] for hypotheses in rows for row in hypotheses]
        results = self._score_results(sources, targets)
        # A hypothesis cut at the length limit has no END, which CTranslate2 scores
        # all the same: its last log-probability is not the hypothesis's.
        return np.array([sum(result.log_probs[:None if self._end_id in row else -1])
                         for result, row in zip(results, targets)],
                        np.float32).reshape([len(rows), -1])

    def _score_results(self, sources, targets):
        """CTranslate2's `ScoringResult`s of target id lists (END last) after sources.

        CTranslate2 adds START before each target and reads END as its end: the end
        token is given as a piece of the target, scored as the last token."""
        return self._translator.score_batch(
            [self._pieces(ids) for ids in sources],
            [self._pieces([i for i in ids if i != self._end_id]) for ids in targets],
            max_input_length=0)

    def _pieces(self, ids):
        return [self._processor.id_to_piece(int(i)) for i in ids]

    def _texts(self, rows):
        return np.array(
            [self._processor.decode([j for j in row if j != self._end_id]).encode("utf-8")
             for row in rows], dtype=object).reshape([len(rows)])

    def _limit(self, source_length):
        """Output tokens allowed, END included, for a source of `source_length` ids."""
        limit = min(source_length + self.options["extra_length"],
                    self.options["max_source_length"] - 1)
        if self.options.get("max_output_length"):
            limit = min(limit, self.options["max_output_length"])
        return limit


def held_signatures(options):
    """The signatures a CTranslate2 export's options (`files.CTRANSLATE2_OPTIONS`)
    hold: exports older than `sample` and `align` lack their options."""
    needs = {SAMPLE_SIGNATURE: "sampling_top_k", ALIGN_SIGNATURE: "alignment_layer"}
    return [name for name in files.SIGNATURES
            if needs.get(name, "max_source_length") in options]


def _text(sentence):
    return sentence.decode("utf-8", "replace") if isinstance(sentence, bytes) else str(sentence)


def _word_indices(rows, word_starts, special_ids):
    """NumPy's `decoding.alignment.word_indices` of id lists: int32 `(B, longest)`,
    -1 at special ids and padding."""
    ids = _padded(rows, special_ids[0])
    real = ~np.isin(ids, special_ids)
    opens = (word_starts[ids] | (np.cumsum(real, axis=1) == 1)) & real
    return np.where(real, np.cumsum(opens, axis=1) - 1, -1).astype(np.int32)


def _padded(rows, value, dtype=np.int32):
    """Returns the lists `rows` as one `(len(rows), longest)` array padded with `value`."""
    width = max((len(row) for row in rows), default=0)
    array = np.full([len(rows), width], value, dtype)
    for i, row in enumerate(rows):
        array[i, :len(row)] = row
    return array
