"""The long-document settings of coreference prediction, without importing torch (the command line's help reads
them)."""
PREDICTION_MODES = ("auto", "exact", "bounded")
DEFAULT_EXACT_MAX_WORDS = 10_000  # predicted exactly in about 2 GB on a CPU (10,000 words of Bleak House: 1.6-2.1 GB)
# chosen on LitBank fold 0 dev (benchmarks/coreference/coref_novel/quality): 250-2,000 words scored 38.8-39.4 CoNLL F1,
# 1,000 the best; it is also about what the head sees in training (windows of 3 segments of 384 tokens)
DEFAULT_MAX_ANTECEDENT_DISTANCE = 1_000
DEFAULT_ENTITY_CACHE_SIZE = 1_000
