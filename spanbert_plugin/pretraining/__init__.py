"""SpanBERT pre-training: corpus preparation, span/word/subword masking, document blocks, the
``spanbert_pretraining`` task (and its ``span_masked_lm`` alias) and the ``span_bert`` (MLM + SBO) criterion."""
