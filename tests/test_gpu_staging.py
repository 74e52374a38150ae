"""benchmarks/gpu/stage_continued_pretraining.py: the model that travels to the GPU machine comes back as a float32
checkpoint with every weight rounded to float16 once, the tied weights still tied, and the rest of the checkpoint
unchanged."""
import os
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
import stage_continued_pretraining as stage  # noqa: E402


def test_packed_model_unpacks_to_its_float16_rounding_with_ties_kept(tmp_path):
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(50, 8, generator=generator) * 0.05
    model = {"encoder.embed.weight": embeddings, "lm_head.weight": embeddings,  # tied, as the import writes them
             "encoder.layer.0.weight": torch.randn(8, 8, generator=generator),
             "encoder.layer.0.bias": torch.tensor([1e-5, -3.0, 35000.0, 0.0, 1.0, 2.0, 3.0, 4.0]),
             "scalar": torch.tensor(0.125), "positions": torch.arange(6)}
    torch.save({"model": model, "cfg": {"model": {"encoder_layers": 1}}, "extra_state": {"epoch": 3}},
               tmp_path / "model.pt")
    stage.pack_model(str(tmp_path / "model.pt"), str(tmp_path / "imported.xz"))
    stage.unpack_model(str(tmp_path / "imported.xz"), str(tmp_path / "unpacked.pt"))
    back = torch.load(tmp_path / "unpacked.pt", weights_only=True)
    assert back["cfg"] == {"model": {"encoder_layers": 1}} and back["extra_state"] == {"epoch": 3}
    assert list(back["model"]) == list(model)
    for key, value in model.items():
        expected = value.half().float() if value.is_floating_point() else value
        assert back["model"][key].dtype == (torch.float32 if value.is_floating_point() else value.dtype), key
        assert torch.equal(back["model"][key], expected), key
    assert back["model"]["lm_head.weight"].data_ptr() == back["model"]["encoder.embed.weight"].data_ptr()


def test_export_brings_back_the_arm_best_on_dev_in_parts_that_join_to_its_weights(tmp_path, monkeypatch):
    """export picks the pre-trained arm with the highest mean dev CoNLL F1 (never none, whatever its score), drops
    the optimizer state and splits the weights into parts of at most --part-mib; join rebuilds model.pt from them
    beside the imported encoder's vocabulary files."""
    generator = torch.Generator().manual_seed(1)
    records = tmp_path / "results" / "coref_runs"
    records.mkdir(parents=True)
    dev_scores = {"none": [70.0, 71.0], "subword": [56.0, 57.5], "span+sbo": [58.0, 55.0]}  # means 56.75, 56.5
    for arm, scores in dev_scores.items():
        for seed, score in enumerate(scores, start=1):
            (records / f"{arm}_seed{seed}_fp16.json").write_text(f'{{"best_dev_conll_f1": {score}}}')
    checkpoints = {}
    for arm in ("subword", "span+sbo"):
        folder = tmp_path / "work" / f"pretrain_{arm}" / "pretrain" / arm
        folder.mkdir(parents=True)
        embeddings = torch.randn(300, 64, generator=generator)
        # as fp16 training saves tied decoders: equal copies, each with its own storage
        model = {"encoder.weight": embeddings, "lm_head.weight": embeddings.clone(), "step": torch.tensor(7)}
        torch.save({"model": model, "cfg": {"arm": arm}, "last_optimizer_state": {"state": torch.ones(300, 64)}},
                   folder / "checkpoint_last.pt")
        checkpoints[arm] = model
    out = tmp_path / "out"
    out.mkdir()
    # parts of 1/64 MiB (16 KiB) for a 38 KB model: three of them
    monkeypatch.setattr(stage, "MIB", 2**14)
    monkeypatch.setattr(sys, "argv", ["stage", "export", "--results", str(tmp_path / "results"), "--work",
                                      str(tmp_path / "work"), "--out", str(out), "--choice", str(tmp_path / "choice.json"),
                                      "--part-mib", "1"])
    stage.main()
    parts = sorted(out.iterdir())
    assert [p.name for p in parts] == [f"subword.encoder.part{i}" for i in range(3)]
    assert all(p.stat().st_size <= 2**14 for p in parts)
    imported = tmp_path / "imported"
    imported.mkdir()
    (imported / "vocab.txt").write_text("[PAD]\n")
    (imported / "model.pt").write_text("not copied")
    monkeypatch.setattr(sys, "argv", ["stage", "join", "--parts", *map(str, reversed(parts)), "--imported",
                                      str(imported), "--to", str(tmp_path / "subword")])
    stage.main()
    back = torch.load(tmp_path / "subword" / "model.pt", weights_only=True)
    assert "last_optimizer_state" not in back and back["cfg"] == {"arm": "subword"}
    assert torch.equal(back["model"]["encoder.weight"], checkpoints["subword"]["encoder.weight"].half().float())
    assert back["model"]["lm_head.weight"].data_ptr() == back["model"]["encoder.weight"].data_ptr()  # once, tied
    assert torch.equal(back["model"]["step"], torch.tensor(7))
    assert sorted(os.listdir(tmp_path / "subword")) == ["model.pt", "vocab.txt"]


def test_join_refuses_a_folder_that_exists(tmp_path, monkeypatch, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "model.pt").write_text("a user's file")
    monkeypatch.setattr(sys, "argv", ["stage", "join", "--parts", str(tmp_path / "x.part0"), "--imported",
                                      str(tmp_path), "--to", str(tmp_path / "taken")])
    with pytest.raises(SystemExit, match="exists; expected a new folder"):
        stage.main()
    assert (tmp_path / "taken" / "model.pt").read_text() == "a user's file"


def test_litbank_only_stage_carries_every_fold_and_unpacks_without_a_corpus(tmp_path, monkeypatch):
    """pack without --work stages an encoder and LitBank for fine-tuning only (benchmarks/gpu/litbank.sh): every
    fold's lists and the documents they name, the novels as empty names, no pre-training corpus; unpack rebuilds it."""
    litbank = tmp_path / "shared" / "litbank"
    (litbank / "novels").mkdir(parents=True)
    (litbank / "novels" / "11_alice.txt").write_text("Alice was beginning to get very tired.")
    (litbank / "coref").mkdir()
    for document in ("11_a", "12_b", "13_c"):
        (litbank / "coref" / f"{document}.conll").write_text(f"#begin document ({document}); part 0\n#end document\n")
    for fold, (train, dev, test) in enumerate([("11_a", "12_b", "13_c"), ("12_b", "13_c", "11_a")]):
        (litbank / "splits" / f"fold{fold}").mkdir(parents=True)
        for split, document in (("train", train), ("dev", dev), ("test", test)):
            (litbank / "splits" / f"fold{fold}" / f"{split}.txt").write_text(f"../../coref/{document}.conll\n")
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    torch.save({"model": {"w": torch.full((4, 4), 0.1)}}, encoder / "model.pt")
    (encoder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    stage_dir = tmp_path / "stage"
    monkeypatch.setattr(sys, "argv", ["stage", "pack", "--imported", str(encoder), "--shared",
                                      str(tmp_path / "shared"), "--stage", str(stage_dir)])
    stage.main()
    assert sorted(os.listdir(stage_dir)) == ["imported.xz", "imported_files.tar", "litbank.tar.xz", "whl"]
    monkeypatch.setattr(sys, "argv", ["stage", "unpack", "--stage", str(stage_dir), "--to", str(tmp_path / "to")])
    stage.main()
    back = tmp_path / "to" / "shared" / "litbank"
    for fold in ("fold0", "fold1"):
        for split in ("train", "dev", "test"):
            assert (back / "splits" / fold / f"{split}.txt").read_text() == \
                (litbank / "splits" / fold / f"{split}.txt").read_text()
    assert sorted(os.listdir(back / "coref")) == ["11_a.conll", "12_b.conll", "13_c.conll"]
    assert (back / "novels" / "11_alice.txt").read_text() == ""
    assert not (tmp_path / "to" / "corpus").exists()
    assert (tmp_path / "to" / "imported" / "vocab.txt").read_text() == "[PAD]\n[UNK]\n"
    assert torch.equal(torch.load(tmp_path / "to" / "imported" / "model.pt", weights_only=True)["model"]["w"],
                       torch.full((4, 4), 0.1).half().float())
