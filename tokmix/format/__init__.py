"""The on-disk format, a foundation that imports nothing of the pipeline: the typed records tokmix writes as
JSON (`records`: index.json, shards, holdouts, units, streams). A training job that reads shards needs it and
numpy alone."""
