"""Packs (here) and unpacks (on the GPU machine) what the continued-pre-training grid needs there, within the
64 MiB a device call carries: ``benchmarks/gpu/continued_pretraining.sh`` says how it is used.

``pack`` fills ``--stage`` (git-ignored) from this machine:

* ``imported.xz``: the ``spanbert-import-hf`` folder's model.pt with its weights rounded to float16 (47 MB instead
  of 94; tied weights stay tied), bytes grouped high/low before xz; the folder's small files beside it;
* ``corpus.tar.xz``: masking_ablation's prepared pre-training corpus and held-out text (``--work`` of a run of
  ``benchmarks/pretraining/masking_ablation.py --from-model ... --heldout-mlm --seeds``, which prepares them and trains nothing);
* ``litbank.tar.xz``: LitBank's fold lists (all ten) and the coreference files they name. The novels are not carried (the corpus
  is prepared): their names are, as empty files, because the driver lists them to know which novels it used;
* ``whl/``: fairseq-fixed built for the machine's Python without its torch extensions (the plugin uses none of
  them, so the wheel does not depend on the machine's torch), and the pure-Python packages the machine lacks.

``unpack`` rebuilds them under ``--to``: ``imported/`` (model.pt in float32, the rounded values), ``corpus/`` and
``shared/litbank/``. Without ``--work``, ``pack`` leaves the corpus out: a stage for LitBank fine-tuning only
(``benchmarks/gpu/litbank.sh``), which also takes a folder ``join`` made in place of the imported encoder.

``export`` (on the GPU machine, after the grid) brings one pre-trained arm back for longer fine-tuning elsewhere: the
arm with the highest mean LitBank dev CoNLL F1 over its seeds, its weights in float16 without the optimizer state,
in parts under the device's 16 MiB per file. ``join`` (here) turns the parts into a folder fine-tuning can start
from: model.pt in float32 beside the imported encoder's vocabulary files.
"""
import argparse
import io
import json
import lzma
import os
import shutil
import sys
import tarfile

import numpy as np

MIB = 2**20


def pack_model(model_pt, out, compress=True):
    """model.pt's weights as float16, high bytes then low bytes, xz-compressed (``compress``: float16 weights gain
    12% from xz, at 40 s on one core); the rest of the checkpoint, less any optimizer state, in a header. Tied
    weights (the embeddings, the MLM and SBO decoders: shared storage, or equal copies) are stored once."""
    import torch

    state = torch.load(model_pt, map_location="cpu", weights_only=True)
    state.pop("last_optimizer_state", None)  # fine-tuning starts its own
    layout, arrays, first_of = [], [], {}
    for key, tensor in state["model"].items():
        storage = (tensor.untyped_storage().data_ptr(), tuple(tensor.shape))
        # tied weights share storage in an import, but a checkpoint saved from fp16 training holds a copy of each
        twin = first_of.get(storage) or next((k for k in first_of.values() if state["model"][k].shape == tensor.shape
                                             and state["model"][k].dtype == tensor.dtype
                                             and torch.equal(state["model"][k], tensor)), None)
        if twin is not None:
            layout.append({"key": key, "same_as": twin})
            continue
        first_of[storage] = key
        if tensor.is_floating_point():
            value = tensor.detach().to(torch.float16)
            if not torch.isfinite(value).all():
                sys.exit(f"stage: {key} does not fit in float16")
            arrays.append(value.numpy().ravel())
            layout.append({"key": key, "shape": list(tensor.shape), "dtype": "float16"})
        else:
            layout.append({"key": key, "tensor": tensor})
    state["model"] = {}
    pairs = np.concatenate(arrays).view(np.uint8).reshape(-1, 2)
    header = io.BytesIO()
    torch.save({"checkpoint": state, "layout": layout}, header)
    with (lzma.open(out, "wb", preset=6) if compress else open(out, "wb")) as f:
        f.write(len(header.getvalue()).to_bytes(8, "little"))
        f.write(header.getvalue())
        f.write(np.ascontiguousarray(pairs[:, 1]).tobytes())
        f.write(np.ascontiguousarray(pairs[:, 0]).tobytes())


def unpack_model(packed, model_pt):
    """The inverse of pack_model: a float32 model.pt with the float16-rounded weights."""
    import torch

    with open(packed, "rb") as f:
        blob = f.read()
    if blob.startswith(b"\xfd7zXZ\x00"):
        blob = lzma.decompress(blob)
    size = int.from_bytes(blob[:8], "little")
    header = torch.load(io.BytesIO(blob[8:8 + size]), map_location="cpu", weights_only=True)
    halves = np.frombuffer(blob[8 + size:], dtype=np.uint8)
    n = len(halves) // 2
    values = np.empty((n, 2), dtype=np.uint8)
    values[:, 1], values[:, 0] = halves[:n], halves[n:]
    flat = torch.from_numpy(values.view(np.float16).ravel().copy()).float()
    model, offset = {}, 0
    for entry in header["layout"]:
        if "same_as" in entry:
            model[entry["key"]] = model[entry["same_as"]]
        elif "tensor" in entry:
            model[entry["key"]] = entry["tensor"]
        else:
            count = int(np.prod(entry["shape"]))  # 1 for a scalar's empty shape
            model[entry["key"]] = flat[offset:offset + count].view(entry["shape"]).clone()
            offset += count
    if offset != len(flat):
        sys.exit(f"stage: {packed} holds {len(flat)} weights, its layout {offset}")
    checkpoint = header["checkpoint"]
    checkpoint["model"] = model
    torch.save(checkpoint, model_pt)


def add_folder(tar, folder, arcname, skip=()):
    for name in sorted(os.listdir(folder)):
        if name not in skip:
            tar.add(os.path.join(folder, name), arcname=f"{arcname}/{name}")


def pack(args):
    os.makedirs(args.stage, exist_ok=True)
    pack_model(os.path.join(args.imported, "model.pt"), os.path.join(args.stage, "imported.xz"))
    with tarfile.open(os.path.join(args.stage, "imported_files.tar"), "w") as tar:
        add_folder(tar, args.imported, "imported", skip={"model.pt"})
    if args.work:  # without it the stage is for LitBank fine-tuning only (benchmarks/gpu/litbank.sh)
        with tarfile.open(os.path.join(args.stage, "corpus.tar.xz"), "w:xz") as tar:
            for name in ("pretrain_data", "heldout_data", "heldout_text"):
                add_folder(tar, os.path.join(args.work, name), f"corpus/{name}")
    litbank = os.path.join(args.shared, "litbank")
    splits = os.path.join(litbank, "splits")
    documents = set()  # every fold's lists, and the documents they name (relative to the fold's folder)
    for fold in sorted(os.listdir(splits)):
        for split in ("train", "dev", "test"):
            with open(os.path.join(splits, fold, f"{split}.txt"), encoding="utf-8") as f:
                documents.update(os.path.normpath(os.path.join(splits, fold, line.strip())) for line in f if line.strip())
    with tarfile.open(os.path.join(args.stage, "litbank.tar.xz"), "w:xz") as tar:
        tar.add(splits, arcname="litbank/splits")
        for path in sorted(documents):
            tar.add(path, arcname="litbank/" + os.path.relpath(path, litbank))
        for novel in sorted(os.listdir(os.path.join(litbank, "novels"))):
            info = tarfile.TarInfo(f"litbank/novels/{novel}")
            tar.addfile(info, io.BytesIO(b""))
    whl = os.path.join(args.stage, "whl")
    os.makedirs(whl, exist_ok=True)
    for wheel in args.wheels:
        shutil.copy(wheel, whl)
    sizes = {name: os.path.getsize(os.path.join(args.stage, name)) for name in os.listdir(args.stage)
             if os.path.isfile(os.path.join(args.stage, name))}
    sizes["whl"] = sum(os.path.getsize(os.path.join(whl, n)) for n in os.listdir(whl))
    print(json.dumps(sizes, indent=1))
    print(f"staged {sum(sizes.values()) / 2**20:.1f} MiB in {args.stage}")


def unpack(args):
    os.makedirs(args.to, exist_ok=True)
    for archive in ("imported_files.tar", "corpus.tar.xz", "litbank.tar.xz"):
        if archive == "corpus.tar.xz" and not os.path.exists(os.path.join(args.stage, archive)):
            continue  # a stage for LitBank fine-tuning only
        with tarfile.open(os.path.join(args.stage, archive)) as tar:
            tar.extractall(os.path.join(args.to, "shared") if archive.startswith("litbank") else args.to,
                           filter="data")
    unpack_model(os.path.join(args.stage, "imported.xz"), os.path.join(args.to, "imported", "model.pt"))
    print(f"unpacked into {args.to}: {', '.join(sorted(os.listdir(args.to)))}", flush=True)


def export_parts(checkpoint, packed, out, name, part_mib):
    """``checkpoint`` packed as export brings it back (float16, no optimizer state, tied weights once, not
    compressed) into ``packed``, then split into ``out``/NAME.encoder.partN of at most ``part_mib`` MiB; the parts'
    paths."""
    pack_model(checkpoint, packed, compress=False)
    parts = []
    with open(packed, "rb") as f:
        while chunk := f.read(part_mib * MIB):
            parts.append(os.path.join(out, f"{name}.encoder.part{len(parts)}"))
            with open(parts[-1], "wb") as part:
                part.write(chunk)
    return parts


def export(args):
    """The arm with the best mean dev CoNLL F1 (masking_ablation's coref_runs records), packed in parts."""
    import glob
    import statistics

    dev = {}
    for record in glob.glob(os.path.join(args.results, "coref_runs", "*.json")):
        with open(record, encoding="utf-8") as f:
            run = json.load(f)
        arm = os.path.basename(record).split("_seed")[0]
        if arm != "none" and run.get("best_dev_conll_f1") is not None:
            dev.setdefault(arm, []).append(run["best_dev_conll_f1"])
    if not dev:
        sys.exit(f"stage export: no finished LitBank run of a pre-trained arm in {args.results}/coref_runs")
    means = {arm: statistics.mean(scores) for arm, scores in dev.items()}
    chosen = max(means, key=means.get)
    # each invocation's --work links the pre-training it fine-tunes from: one checkpoint behind the links
    checkpoints = sorted({os.path.realpath(path) for path in
                          glob.glob(os.path.join(args.work, "*", "pretrain", chosen, "checkpoint_last.pt"))})
    if len(checkpoints) != 1:
        sys.exit(f"stage export: {len(checkpoints)} pre-training checkpoints of {chosen} under {args.work}")
    name = chosen.replace("+", "_")  # the device returns files named in letters, digits, '.', '_' and '-'
    parts = export_parts(checkpoints[0], os.path.join(args.work, f"{name}.encoder"), args.out, name, args.part_mib)
    choice = {"chosen": chosen, "checkpoint": checkpoints[0], "parts": len(parts),
              "dev_conll_f1": {arm: {"mean": means[arm], "seeds": len(dev[arm])} for arm in sorted(dev)}}
    with open(args.choice, "w") as f:
        json.dump(choice, f, indent=1)
    print(json.dumps(choice), flush=True)


def join(args):
    """An exported arm's parts as a folder to fine-tune from: model.pt and the imported encoder's other files."""
    if os.path.exists(args.to):
        sys.exit(f"stage join: --to {args.to} exists; expected a new folder (nothing is overwritten)")
    os.makedirs(args.to)
    packed = os.path.join(args.to, "encoder.packed")
    with open(packed, "wb") as out:
        for part in sorted(args.parts, key=lambda path: int(path.rsplit(".part", 1)[1])):
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
    unpack_model(packed, os.path.join(args.to, "model.pt"))
    os.remove(packed)
    for name in os.listdir(args.imported):
        if name != "model.pt" and os.path.isfile(os.path.join(args.imported, name)):
            shutil.copy(os.path.join(args.imported, name), args.to)
    print(f"joined {len(args.parts)} parts into {args.to}/model.pt")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--imported", required=True, help="spanbert-import-hf folder of all-MiniLM-L6-v2 (or any folder "
                   "of a spanbert model.pt and its vocabulary files, such as one stage join made)")
    p.add_argument("--work", help="masking_ablation --work folder with the prepared corpus (leave it out for a stage "
                   "that only fine-tunes on LitBank)")
    p.add_argument("--shared", default=os.environ.get("SPANBERT_SHARED_DATA", "../shared/data"))
    p.add_argument("--wheels", nargs="*", default=[], help="wheels for the machine's Python")
    p.add_argument("--stage", default=".gpu/cp")
    u = sub.add_parser("unpack")
    u.add_argument("--stage", default=".gpu/cp")
    u.add_argument("--to", required=True)
    e = sub.add_parser("export")
    e.add_argument("--results", required=True, help="masking_ablation --results folder of the grid")
    e.add_argument("--work", required=True, help="the folder holding the invocations' --work folders")
    e.add_argument("--out", required=True, help="where the parts go ($OUT)")
    e.add_argument("--choice", required=True, help="JSON file recording the choice")
    e.add_argument("--part-mib", type=int, default=15)
    j = sub.add_parser("join")
    j.add_argument("--parts", nargs="+", required=True)
    j.add_argument("--imported", required=True, help="spanbert-import-hf folder (its vocabulary files are copied)")
    j.add_argument("--to", required=True, help="a new folder")
    args = parser.parse_args()
    {"pack": pack, "unpack": unpack, "export": export, "join": join}[args.command](args)


if __name__ == "__main__":
    main()
