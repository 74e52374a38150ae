"""Packs (here) and unpacks (on the GPU machine) what the continued-pre-training grid needs there, within the
64 MiB a device call carries: ``benchmarks/gpu/continued_pretraining.sh`` says how it is used.

``pack`` fills ``--stage`` (git-ignored) from this machine:

* ``imported.xz``: the ``spanbert-import-hf`` folder's model.pt with its weights rounded to float16 (47 MB instead
  of 94; tied weights stay tied), bytes grouped high/low before xz; the folder's small files beside it;
* ``corpus.tar.xz``: masking_ablation's prepared pre-training corpus and held-out text (``--work`` of a run of
  ``benchmarks/masking_ablation.py --from-model ... --heldout-mlm --seeds``, which prepares them and trains nothing);
* ``litbank.tar.xz``: LitBank's fold lists and the fold's coreference files. The novels are not carried (the corpus
  is prepared): their names are, as empty files, because the driver lists them to know which novels it used;
* ``whl/``: fairseq-fixed built for the machine's Python without its torch extensions (the plugin uses none of
  them, so the wheel does not depend on the machine's torch), and the pure-Python packages the machine lacks.

``unpack`` rebuilds them under ``--to``: ``imported/`` (model.pt in float32, the rounded values), ``corpus/`` and
``shared/litbank/``.
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


def pack_model(model_pt, out):
    """model.pt's weights as float16, high bytes then low bytes, xz-compressed; the rest of the checkpoint in a
    header. Tensors sharing storage (the tied embeddings) are stored once."""
    import torch

    state = torch.load(model_pt, map_location="cpu", weights_only=True)
    layout, arrays, first_of = [], [], {}
    for key, tensor in state["model"].items():
        storage = (tensor.untyped_storage().data_ptr(), tuple(tensor.shape))
        if storage in first_of:
            layout.append({"key": key, "same_as": first_of[storage]})
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
    with lzma.open(out, "wb", preset=6) as f:
        f.write(len(header.getvalue()).to_bytes(8, "little"))
        f.write(header.getvalue())
        f.write(np.ascontiguousarray(pairs[:, 1]).tobytes())
        f.write(np.ascontiguousarray(pairs[:, 0]).tobytes())


def unpack_model(packed, model_pt):
    """The inverse of pack_model: a float32 model.pt with the float16-rounded weights."""
    import torch

    with lzma.open(packed, "rb") as f:
        blob = f.read()
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
    with tarfile.open(os.path.join(args.stage, "corpus.tar.xz"), "w:xz") as tar:
        for name in ("pretrain_data", "heldout_data", "heldout_text"):
            add_folder(tar, os.path.join(args.work, name), f"corpus/{name}")
    litbank = os.path.join(args.shared, "litbank")
    fold = os.path.join(litbank, "splits", f"fold{args.fold}")
    documents = []
    for split in ("train", "dev", "test"):
        with open(os.path.join(fold, f"{split}.txt"), encoding="utf-8") as f:
            documents += [line.strip() for line in f if line.strip()]
    with tarfile.open(os.path.join(args.stage, "litbank.tar.xz"), "w:xz") as tar:
        tar.add(fold, arcname=f"litbank/splits/fold{args.fold}")
        for document in documents:  # the lists name files relative to the fold's folder
            path = os.path.normpath(os.path.join(fold, document))
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
        with tarfile.open(os.path.join(args.stage, archive)) as tar:
            tar.extractall(os.path.join(args.to, "shared") if archive.startswith("litbank") else args.to,
                           filter="data")
    unpack_model(os.path.join(args.stage, "imported.xz"), os.path.join(args.to, "imported", "model.pt"))
    print(f"unpacked into {args.to}: imported/, corpus/, shared/litbank/", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--imported", required=True, help="spanbert-import-hf folder of all-MiniLM-L6-v2")
    p.add_argument("--work", required=True, help="masking_ablation --work folder with the prepared corpus")
    p.add_argument("--shared", default=os.environ.get("SPANBERT_SHARED_DATA", "../shared/data"))
    p.add_argument("--fold", type=int, default=0)
    p.add_argument("--wheels", nargs="*", default=[], help="wheels for the machine's Python")
    p.add_argument("--stage", default=".gpu/cp")
    u = sub.add_parser("unpack")
    u.add_argument("--stage", default=".gpu/cp")
    u.add_argument("--to", required=True)
    args = parser.parse_args()
    pack(args) if args.command == "pack" else unpack(args)


if __name__ == "__main__":
    main()
