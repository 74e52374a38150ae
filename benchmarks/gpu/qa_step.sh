#!/usr/bin/env bash
# ON THE GPU MACHINE, after `source benchmarks/gpu/setup.sh`: the extractive_qa fine-tuning step at
# spanbert_base size, 32 x 384 SQuAD dev windows, fp16 autocast, against transformers'
# BertForQuestionAnswering (same weights, same batches). Log: $OUT/qa_step.log.
SQUAD_DEV=.gpu/squad/dev-v1.1.json timeout 200 python benchmarks/cpu_speed/qa_step_time.py --device cuda --amp \
    --layers 12 --dim 768 --heads 12 --ffn 3072 --batch 32 --seq 384 --steps 40 --warmup 5 \
    --tokenizer-from .gpu/novels8 --no-fairseq-adam 2>&1 | tee $OUT/qa_step.log | tail -8
