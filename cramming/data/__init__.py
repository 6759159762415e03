"""Data: raw text sources -> trained tokenizer -> packed, cached token arrays -> MLM batches."""
