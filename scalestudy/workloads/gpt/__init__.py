"""A GPT-style decoder LM on a byte-tokenised corpus: its model, its token loader and its entry
(workload)."""
