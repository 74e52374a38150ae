#!/usr/bin/env bash
# ON THE GPU MACHINE, after `source benchmarks/gpu/setup.sh`: the fp16 training loop of spanbert_base
# (dynamic loss scaling, resume, bf16, amp, NCCL). Logs go to $OUT/loop.tgz (fairseq's json log lines:
# losses and loss_scale per 10 updates, and the overflow notes).
#   bash benchmarks/gpu/training_loop.sh            (PARTS="fp16 resume bf16 amp nccl" by default)
LOGS=/tmp/gpulogs/loop; mkdir -p $LOGS; rm -rf /tmp/ckpt; mkdir -p /tmp/ckpt
PARTS=" ${PARTS:-fp16 resume bf16 amp nccl} "
TRAIN=(fairseq-train .gpu/novels8 --user-dir user_dir --task spanbert_pretraining --criterion span_bert
       --arch spanbert_base --tokens-per-sample 512 --batch-size 8 --num-workers 2 --seed 1
       --optimizer adam --adam-betas '(0.9,0.999)' --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 1.0
       --lr 1e-4 --lr-scheduler polynomial_decay --warmup-updates 30 --total-num-update 300
       --log-format json --log-interval 10 --disable-validation --no-epoch-checkpoints)
# a high first loss scale and a short window, so that backing off on overflow and growing again
# both happen within a few hundred updates (the base recipe starts at 128, window 2^14 / update_freq)
FP16=(--fp16 --fp16-init-scale 1048576 --fp16-scale-window 20)
source benchmarks/gpu/common.sh
nvidia-smi > $LOGS/nvidia-smi.txt
# 1. fp16: uninterrupted 300 updates; the same run stopped at 150 and resumed from checkpoint_last.pt
if [[ $PARTS == *" fp16 "* ]]; then
    run fp16_uninterrupted 240 "${TRAIN[@]}" "${FP16[@]}" --max-update 300 --save-dir /tmp/ckpt/a --no-save
fi
if [[ $PARTS == *" resume "* ]]; then
    run fp16_first_half 180 "${TRAIN[@]}" "${FP16[@]}" --max-update 150 --save-dir /tmp/ckpt/b
    run fp16_resumed 180 "${TRAIN[@]}" "${FP16[@]}" --max-update 300 --save-dir /tmp/ckpt/b
fi
# bf16: fairseq's argparse --bf16 means a TPU (options.py sets --tpu), so bf16 on a GPU goes through the
# hydra recipe, where common.bf16 stays a plain dtype switch
if [[ $PARTS == *" bf16 "* ]]; then
    run bf16_hydra 150 fairseq-hydra-train --config-dir configs/pretrain --config-name base task.data=$PWD/.gpu/novels8 \
        common.fp16=false common.bf16=true common.log_interval=10 optimization.max_update=60 'optimization.update_freq=[1]' \
        'optimization.lr=[0.0001]' dataset.batch_size=8 dataset.disable_validation=true lr_scheduler.warmup_updates=30 \
        lr_scheduler.total_num_update=300 checkpoint.save_dir=/tmp/ckpt/c checkpoint.no_save=true
fi
# amp (torch.autocast + GradScaler), 60 updates
if [[ $PARTS == *" amp "* ]]; then
    run amp 120 "${TRAIN[@]}" --amp --max-update 60 --save-dir /tmp/ckpt/d --no-save
fi
# 3. NCCL: one rank through torch.distributed with the NCCL backend (init, all-reduce check, training)
if [[ $PARTS == *" nccl "* ]]; then
    run nccl_world1 120 "${TRAIN[@]}" "${FP16[@]}" --max-update 30 --save-dir /tmp/ckpt/e --no-save \
        --distributed-world-size 1 --distributed-rank 0 --distributed-backend nccl \
        --distributed-init-method tcp://127.0.0.1:29517 --distributed-no-spawn --ddp-backend pytorch_ddp
fi
tar czf $OUT/loop.tgz -C /tmp/gpulogs loop
