#!/usr/bin/env python
"""The size of what ``benchmarks/gpu/stage_continued_pretraining.py export`` brings back from a device call for a
MiniLM-size encoder, made on a CPU: one update of continued pre-training (span masking + SBO, the grid's
``fairseq-train`` task, criterion and architecture, from the ``spanbert-import-hf`` folder of all-MiniLM-L6-v2) gives a
checkpoint of the shape the grid saves; export's own packing (``export_parts``: float16, no optimizer state, tied
weights once, uncompressed) then splits it into parts of ``--part-mib``.

    .venv/bin/python benchmarks/against_transformers/fetch_minilm.py
    .venv/bin/spanbert-import-hf --hf benchmarks/against_transformers/cache/all-MiniLM-L6-v2 --out /tmp/export_size/imported
    .venv/bin/python benchmarks/gpu/export_size.py --imported /tmp/export_size/imported --work /tmp/export_size/work \
        --out benchmarks/gpu/export_size/sizes.json

The grid trains under ``--fp16`` on the GPU, so its checkpoint holds float16 weights, the tied decoder as an equal
copy (stored once all the same) and fp16 training state; the weights' bytes are the same, the small header (the
checkpoint less its weights and optimizer state) may differ by a few KB. Writes the JSON file ``--out`` and a table
beside it (``.md`` for ``.json``); an existing ``--out`` is replaced only with ``--force``, and only when it is an
earlier result of this script.
"""
import argparse
import io
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
from command_output import write_atomic  # noqa: E402
from results_file import add_json_out_options, check_json_out, claim_work_folder, write_results_file  # noqa: E402

RESULT_KEYS = ("checkpoint_bytes", "packed_bytes", "part_mib", "parts")
BIN = os.path.dirname(sys.executable)
SHARED = os.environ.get("SPANBERT_SHARED_DATA", os.path.join(os.path.dirname(ROOT), "shared", "data"))
MIB = 2**20


def run(argv, work, name):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]))
    with open(os.path.join(work, f"{name}.log"), "w", encoding="utf-8") as log:
        process = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if process.returncode:
        sys.exit(f"export_size.py: {name} failed ({process.returncode}); see {work}/{name}.log")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imported", required=True, help="spanbert-import-hf folder of all-MiniLM-L6-v2")
    parser.add_argument("--novel", default=os.path.join(SHARED, "litbank", "novels", "1064_the_masque_of_the_red_death.txt.gz"),
                        help="text to pre-train the one update on (a LitBank novel by default)")
    parser.add_argument("--work", required=True, help="scratch folder (the corpus, the checkpoint, the parts)")
    parser.add_argument("--part-mib", type=int, default=15, help="export's --part-mib")
    add_json_out_options(parser)
    args = parser.parse_args()
    table_path = check_json_out(parser, args, "export_size.py", RESULT_KEYS)
    for path in (os.path.join(args.imported, "model.pt"), os.path.join(args.imported, "vocab.txt"), args.novel):
        if not os.path.isfile(path):
            sys.exit(f"export_size.py: no {path}")
    claim_work_folder(args.work, "--work", ".export_size", "export_size.py")
    import stage_continued_pretraining as stage
    import torch

    work, imported = os.path.abspath(args.work), os.path.abspath(args.imported)
    corpus, save_dir, parts_dir = (os.path.join(work, name) for name in ("corpus", "pretrain_span_sbo", "parts"))
    for folder in (corpus, save_dir, parts_dir):  # this script's own scratch, made again each run
        subprocess.run(["rm", "-rf", folder], check=True)
    os.makedirs(parts_dir)
    # the same text as its valid split: a single document cannot be split, and the run does not validate
    run([os.path.join(BIN, "spanbert-prepare"), "--train", args.novel, "--valid", args.novel, "--join-wrapped-lines",
         "--wordpiece-vocab",
         os.path.join(imported, "vocab.txt"), "--lowercase", "--destdir", corpus], work, "prepare")
    # benchmarks/pretraining/masking_ablation.py's continued pre-training (span + SBO) for one update, on the CPU
    run([os.path.join(BIN, "fairseq-train"), corpus, "--user-dir", os.path.join(ROOT, "user_dir"), "--task",
         "spanbert_pretraining", "--criterion", "span_bert", "--arch", "spanbert_base", "--finetune-from-model",
         os.path.join(imported, "model.pt"), "--tokens-per-sample", "128", "--mask-scheme", "span", "--sbo-weight", "1.0",
         "--optimizer", "adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-8", "--weight-decay", "0.01",
         "--lr", "1e-4", "--batch-size", "4", "--max-update", "1", "--cpu", "--num-workers", "0", "--save-dir", save_dir,
         "--no-epoch-checkpoints", "--disable-validation"], work, "pretrain")
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    packed = os.path.join(work, "span_sbo.encoder")
    parts = stage.export_parts(checkpoint, packed, parts_dir, "span_sbo", args.part_mib)
    with open(packed, "rb") as f:
        blob = f.read()
    header_bytes = int.from_bytes(blob[:8], "little")
    layout = torch.load(io.BytesIO(blob[8:8 + header_bytes]), map_location="cpu", weights_only=True)["layout"]
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    command = " ".join(["benchmarks/gpu/export_size.py", *sys.argv[1:]])
    result = {"checkpoint_bytes": os.path.getsize(checkpoint), "packed_bytes": len(blob), "header_bytes": header_bytes,
              "packed_mib": len(blob) / MIB, "part_mib": args.part_mib,
              "parts": [{"name": os.path.basename(p), "bytes": os.path.getsize(p)} for p in parts],
              "tensors_stored": sum("shape" in entry for entry in layout),
              "tensors_tied": [entry["key"] for entry in layout if "same_as" in entry],
              "weights_float16": sum(int(torch.Size(entry["shape"]).numel()) for entry in layout if "shape" in entry),
              "model": {key: saved["cfg"]["model"].get(key) for key in ("_name", "encoder_layers", "encoder_embed_dim",
                                                                       "encoder_ffn_embed_dim", "encoder_attention_heads")},
              "updates": saved["optimizer_history"][-1]["num_updates"], "torch": torch.__version__, "command": command}
    write_results_file(args.out, result)
    lines = [f"`stage_continued_pretraining.py export`'s packing of a one-update span + SBO continued pre-training "
             f"checkpoint of all-MiniLM-L6-v2 (CPU, fp32 training, torch {torch.__version__}), written by "
             f"`{command}`.", "",
             "| what | bytes | MiB |", "| --- | --- | --- |",
             f"| checkpoint_last.pt (fp32, optimizer state included) | {result['checkpoint_bytes']:,} | "
             f"{result['checkpoint_bytes'] / MIB:.1f} |",
             f"| packed: float16, no optimizer state, tied weights once | {len(blob):,} | {len(blob) / MIB:.1f} |"]
    lines += [f"| {p['name']} | {p['bytes']:,} | {p['bytes'] / MIB:.1f} |" for p in result["parts"]]
    lines += ["", f"{len(parts)} parts of at most {args.part_mib} MiB; {result['tensors_stored']} tensors stored "
                  f"({result['weights_float16']:,} float16 weights), tied and stored once: "
                  f"{', '.join(result['tensors_tied']) or 'none'}; header {header_bytes:,} bytes."]
    write_atomic(table_path, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
