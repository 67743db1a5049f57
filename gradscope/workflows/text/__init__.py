"""The text study: a pretrained causal LM read on a raw text, its tokens grouped by their frequency in that
text. ``tokenize`` tokenises (and caches) the text; ``accuracy`` scores perplexity and accuracy by frequency and
position; ``probes`` draws stability probes and dynamics sequences from the text's paragraphs; ``study`` runs
all three into one folder (``gradscope reproduce --model-dir DIR --text FILE``)."""
