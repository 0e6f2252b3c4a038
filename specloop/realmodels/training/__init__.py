"""Offline training of draft heads: warm-up corpus, target feature cache, trainers (issue 6)."""
