"""Text corpora for language modelling (issue #27): preparation (SentencePiece) and memory-mapped
reading. ``sentencepiece`` is imported only when a tokenizer is trained or used."""

from gradscope.corpus.prepare import CorpusSettings, decode_ids, encode_text, prepare_corpus
from gradscope.corpus.store import Corpus, Split, frequency_bins, frequency_ranks, open_corpus
from gradscope.corpus.text import is_heading, paragraphs, split_paragraphs

__all__ = ["Corpus", "CorpusSettings", "Split", "decode_ids", "encode_text", "frequency_bins", "frequency_ranks",
           "is_heading", "open_corpus", "paragraphs", "prepare_corpus", "split_paragraphs"]
