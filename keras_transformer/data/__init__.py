"""Text to ids to batches: corpus files and downloads, the tokenizer, pairs, batching."""
