"""Text corpora for language modelling: the memory-mapped corpus on disk and its reader.
Preparing one (SentencePiece) is a workflow: :mod:`gradscope.workflows.corpus`."""

from gradscope.corpus.store import Corpus, Split, frequency_bins, frequency_ranks, open_corpus
from gradscope.corpus.text import is_heading, paragraphs, split_paragraphs

__all__ = ["Corpus", "Split", "frequency_bins", "frequency_ranks", "is_heading", "open_corpus", "paragraphs",
           "split_paragraphs"]
