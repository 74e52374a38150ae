"""Coreference of long documents: bounded-memory prediction equals the exact head where a document fits one block,
its memory stays flat in the document's length, and ``spanbert-predict-coref --text`` writes offsets into the text."""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, bin_path, run_cli
from test_coref_train import build, gold_and_predicted, synthetic_data, train_command, train_in_process  # noqa: F401

PROBE = os.path.join(ROOT, "tests", "coref_memory_probe.py")


@pytest.fixture(scope="module")
def trained(synthetic_data):  # noqa: F811
    """A tiny coreference model trained 3 epochs in-process (it links names; a random one links almost nothing)."""
    torch.manual_seed(0)
    task, model, criterion = build(synthetic_data, "--coref-dropout", "0", "--dropout", "0", "--attention-dropout",
                                   "0")
    task.load_dataset("train", training=True)
    task.load_dataset("valid")
    train_in_process(model, criterion, task.dataset("train"), 3)
    return task, model.eval(), criterion


def test_bounded_equals_exact_where_a_document_fits_one_block(trained):
    """One block, no distance limit: the exact head's clusters, document by document; and with the defaults
    (1,000 words, 1,000 entities) on these short documents too, through the validation path (counts and loss)."""
    from spanbert_plugin.coref.long_document import bounded_document_clusters
    from spanbert_plugin.coref.predict import document_clusters

    task, model, criterion = trained
    dataset = task.dataset("valid")
    _, exact = gold_and_predicted(model, dataset, task.singleton_threshold)
    model.eval()
    linked = 0
    for i in range(len(dataset)):
        sample = dataset.collater([dataset[i]])
        with torch.no_grad():
            whole, _ = bounded_document_clusters(model, sample, task.singleton_threshold, None, None,
                                                 block_segments=10_000)
            in_blocks_of_one, _ = bounded_document_clusters(model, sample, task.singleton_threshold, None, None,
                                                            block_segments=1)
        assert whole == exact[i]
        linked += sum(len(c) > 1 for c in exact[i])
        task.cfg.coref_prediction = "bounded"
        assert document_clusters(model, task, sample, task.singleton_threshold, lambda line: None) == exact[i]
        with torch.no_grad():
            _, _, bounded_log = criterion(model, sample)
        task.cfg.coref_prediction = "exact"
        with torch.no_grad():
            _, _, exact_log = criterion(model, sample)
        assert {k: v for k, v in bounded_log.items() if k not in ("loss", "mention_loss")} == \
            {k: v for k, v in exact_log.items() if k not in ("loss", "mention_loss")}
        # the loss over one block is the exact head's (both with the mention loss)
        assert torch.allclose(bounded_log["loss"], exact_log["loss"], rtol=1e-5), (bounded_log, exact_log)
        assert len({m for c in in_blocks_of_one for m in c}) > 0  # pruned per segment: a valid prediction still
    task.cfg.coref_prediction = "auto"
    assert linked >= len(dataset)  # the model links names: the comparison is not between empty predictions


def test_a_span_beyond_the_distance_links_only_to_an_entitys_latest_mention(trained):
    """With a tiny window (10 words) and cache (2 entities): after every block, the spans kept from farther back than
    the window are all entities' latest mentions, never more than the cache holds, and some are kept."""
    from spanbert_plugin.coref import long_document

    task, model, _ = trained
    dataset = task.dataset("valid")
    seen = []
    original = long_document._forget

    def recorded(earlier, clusters, next_word, max_distance, cache_size):
        original(earlier, clusters, next_word, max_distance, cache_size)
        far = next_word - earlier.columns["start_word"] > max_distance
        seen.append(int(far.sum()))
        assert bool(earlier.columns["always"][far].all())  # beyond the window: only entities' latest mentions
        assert int(far.sum()) <= cache_size

    long_document._forget = recorded
    try:
        sample = dataset.collater([dataset[0]])
        with torch.no_grad():
            clusters, _ = long_document.bounded_document_clusters(model, sample, 0.5, 10, 2, block_segments=1)
    finally:
        long_document._forget = original
    assert clusters and max(seen) > 0  # something was kept past the window, and never more than the cache


def probe(data, words, mode):
    result = subprocess.run([sys.executable, PROBE, data, str(words), mode], capture_output=True, text=True,
                            timeout=600, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_memory_of_bounded_prediction_is_flat_in_document_length(synthetic_data):  # noqa: F811
    """Peak memory of a process predicting 4,000 and 16,000 words (random-init 1-layer spanbert_tiny, 48-token
    segments, window 300 words, 50 entities) differs by under 60 MB: measured 399 -> 417 MB (the document's tensors,
    words and clusters grow with it). The exact head, measured once with the same probe, takes 621 -> 1,030 MB."""
    short, long_ = probe(synthetic_data, 4000, "bounded"), probe(synthetic_data, 16000, "bounded")
    assert long_["peak_mb"] - short["peak_mb"] < 60, (short, long_)


def test_text_command_offsets_index_the_input_text(synthetic_data, tmp_path):  # noqa: F811
    """spanbert-predict-coref --text on a wrapped text (.gz): every mention's text is the input's characters at its
    offsets; the bounded mode says so in one line; a byte-order mark is dropped (the same words and clusters); a
    missing, empty or blank file is one line and exit 1, nothing written."""
    from spanbert_plugin.coref.predict import split_words

    ck = str(tmp_path / "ck")
    run_cli(train_command(synthetic_data, ck, "--max-update", "20", "--no-epoch-checkpoints", "--seed", "1"))
    names = ["Anna", "Ben", "Clara"]
    rng = np.random.default_rng(0)
    paragraphs = []
    for _ in range(30):
        a, b = rng.choice(names, 2, replace=False)
        paragraphs.append(f"{a} told {b} that the house\nwas old. {b} liked {a} and\nthe dog.")
    text = "\n\n".join(paragraphs) + "\n"
    book = tmp_path / "book.txt.gz"
    with gzip.open(book, "wt", encoding="utf-8") as f:
        f.write(text)
    out = tmp_path / "out"
    options = ["--join-wrapped-lines", "--coref-prediction", "bounded", "--singleton-threshold", "0.01", "--cpu"]
    result = run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", os.path.join(ck, "checkpoint_last.pt"), "--text",
                      str(book), *options, "--out", str(out)])
    assert "bounded-memory prediction" in result.stderr
    clusters = [json.loads(line) for line in open(out / "clusters.jsonl", encoding="utf-8")]
    mentions = [m for c in clusters for m in c["mentions"]]
    assert mentions and all(text[m["start"]:m["end"]] == m["text"] for m in mentions)
    summary = json.load(open(out / "summary.json", encoding="utf-8"))
    assert summary["words"] == len(split_words(text)[0]) and summary["prediction"] == "bounded"
    # wrapped lines: a sentence ends at "." and at blank lines, never at a single line break
    _, _, joined = split_words(text, "paragraph")
    _, _, by_line = split_words(text, "sentence")
    assert joined[-1] + 1 == 2 * len(paragraphs) and by_line[-1] + 1 == 4 * len(paragraphs)
    missing = run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", os.path.join(ck, "checkpoint_last.pt"), "--text",
                       str(tmp_path / "no.txt"), "--out", str(tmp_path / "out2")], check=False)
    assert missing.returncode == 1 and "no.txt: no such file" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and not (tmp_path / "out2").exists()
    # a UTF-8 byte-order mark is dropped, as from every input: not a word of its own, nor a mention
    marked = tmp_path / "marked.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", os.path.join(ck, "checkpoint_last.pt"), "--text",
             str(marked), *options, "--out", str(tmp_path / "out_marked")])
    assert (tmp_path / "out_marked" / "clusters.jsonl").read_text(encoding="utf-8") == \
        (out / "clusters.jsonl").read_text(encoding="utf-8")
    assert json.load(open(tmp_path / "out_marked" / "summary.json", encoding="utf-8"))["words"] == summary["words"]
    for name, content in (("empty.txt", b""), ("blank.txt", b" \n\t\n"), ("mark_only.txt", b"\xef\xbb\xbf\n")):
        (tmp_path / name).write_bytes(content)
        refused = run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", os.path.join(ck, "checkpoint_last.pt"),
                           "--text", str(tmp_path / name), "--out", str(tmp_path / "out3")], check=False)
        assert refused.returncode == 1 and f"{name}: empty or only white space" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "out3").exists()
    # hub.coref reads line breaks as the command does (each line a sentence; --join-wrapped-lines: join_wrapped_lines)
    # and lists the clusters in the same order
    from spanbert_plugin.coref.predict import apply_prediction_options
    from spanbert_plugin.model.spanbert import SpanBertModel

    hub = SpanBertModel.from_pretrained(ck, "checkpoint_last.pt")
    apply_prediction_options(hub.task, singleton_threshold=0.01)  # this short run's mentions score low
    (tmp_path / "lines.txt").write_text(text, encoding="utf-8")
    for joined_lines in (False, True):
        out_lines = tmp_path / f"out_lines_{joined_lines}"
        run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", os.path.join(ck, "checkpoint_last.pt"), "--text",
                 str(tmp_path / "lines.txt"), "--singleton-threshold", "0.01", "--cpu", "--out", str(out_lines),
                 *(["--join-wrapped-lines"] if joined_lines else [])])
        by_command = [json.loads(line)["mentions"] for line in open(out_lines / "clusters.jsonl", encoding="utf-8")]
        assert by_command and hub.coref(text, join_wrapped_lines=joined_lines) == by_command


def _earlier(start_words):
    from spanbert_plugin.coref.long_document import _Earlier

    k = len(start_words)
    earlier = _Earlier()
    index = torch.arange(k)
    earlier.add([torch.zeros(k, 2)], mention_scores=torch.zeros(k), index=index, speaker=torch.zeros(k, dtype=torch.long),
                segment=torch.zeros(k, dtype=torch.long), start_word=torch.tensor(start_words),
                always=torch.zeros(k, dtype=torch.bool), end_word=torch.tensor(start_words), cluster=torch.zeros_like(index))
    return earlier


def test_bounded_prediction_keeps_spans_exactly_max_distance_words_back():
    """The next block starts at word 10; with a window of 3 words, spans starting at words 7 and 8 (3 and 2 words
    back) stay antecedent candidates, those at 5 and 6 leave (no entity holds them)."""
    from spanbert_plugin.coref.head import ClusterBuilder
    from spanbert_plugin.coref.long_document import _forget

    earlier = _earlier([5, 6, 7, 8])
    _forget(earlier, ClusterBuilder(None), 10, 3, 100)
    assert earlier.columns["start_word"].tolist() == [7, 8]


def test_bounded_prediction_cache_holds_exactly_entity_cache_size_entities():
    """Three entities whose latest mentions (spans 0, 1, 2) are all beyond the window, a cache of 2: the least
    recently mentioned entity (span 0) is evicted, the other two stay, in the spans and in ``latest``."""
    from spanbert_plugin.coref.head import ClusterBuilder
    from spanbert_plugin.coref.long_document import _forget

    earlier = _earlier([0, 1, 2, 3, 4])
    clusters = ClusterBuilder(None)
    clusters.latest = {0: 0, 1: 1, 2: 2}
    _forget(earlier, clusters, 100, 10, 2)
    assert earlier.columns["index"].tolist() == [1, 2]
    assert clusters.latest == {1: 1, 2: 2}
    assert earlier.columns["always"].tolist() == [True, True]


def test_the_words_beside_a_block_are_the_nearest_real_tokens_words():
    """[CLS] w0 w1 w2 [SEP] [CLS] w2 w3 [SEP] in blocks of one segment: before the second block lies word 2 (the
    last real token before it, not word 1), after the first block word 2 (the first real token after it)."""
    from spanbert_plugin.coref.long_document import _words_beside

    token_word = torch.tensor([-1, 0, 1, 2, -1, -1, 2, 3, -1])
    assert _words_beside(token_word, 0, 5) == (-2, 2)
    assert _words_beside(token_word, 5, 9) == (2, -2)


def test_after_each_block_the_window_is_measured_from_the_next_blocks_first_word(trained):
    """In blocks of one segment, the spans kept as antecedent candidates after a block are those starting at most
    ``max_distance`` words before the next block's first word (the block's last word + 1), and entities' latest
    mentions."""
    from spanbert_plugin.coref import long_document

    task, model, _ = trained
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[0]])
    coref = sample["coref"]
    real = coref["token_word"] >= 0
    block_ends = [int(coref["token_word"][real & (coref["token_segment"] == s)].max()) + 1
                  for s in range(sample["net_input"]["src_tokens"].size(0))]
    seen, original = [], long_document._forget

    def recorded(earlier, clusters, next_word, max_distance, cache_size):
        original(earlier, clusters, next_word, max_distance, cache_size)
        seen.append(next_word)

    long_document._forget = recorded
    try:
        with torch.no_grad():
            long_document.bounded_document_clusters(model, sample, 0.5, 3, 2, block_segments=1)
    finally:
        long_document._forget = original
    assert len(block_ends) > 1 and seen == block_ends


def test_a_blocks_loss_labels_its_columns_earlier_spans_first(trained, monkeypatch):
    """The antecedent columns of a block are the earlier blocks' spans, then its own (as the antecedent indices and
    the links take them): with no limits, the gold clusters labelling the columns are every block's row labels so
    far, in block order."""
    from spanbert_plugin.coref import long_document

    task, model, _ = trained
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[0]])
    calls, original = [], long_document.antecedent_loss

    def recorded(scores, antecedents, row_cluster, column_cluster):
        calls.append((row_cluster.clone(), column_cluster.clone()))
        return original(scores, antecedents, row_cluster, column_cluster)

    monkeypatch.setattr(long_document, "antecedent_loss", recorded)
    with torch.no_grad():
        _, loss = long_document.bounded_document_clusters(model, sample, 0.5, None, None, block_segments=1)
    assert loss is not None and len(calls) > 1
    assert any(bool(row.gt(0).any()) for row, _ in calls[1:])  # gold mentions beyond the first block
    for i, (_, columns) in enumerate(calls):
        assert columns.tolist() == torch.cat([row for row, _ in calls[: i + 1]]).tolist()


def test_without_the_mention_loss_a_blocks_loss_is_its_antecedent_loss(trained, monkeypatch):
    """--mention-loss-weight 0 (c2f-coref's loss, no singletons): the bounded loss is the sum of the blocks'
    antecedent losses, no mention loss is computed, and over one block it is the exact head's loss."""
    from spanbert_plugin.coref import long_document

    task, model, criterion = trained
    head = model.coref_head
    assert head.mention_loss_weight > 0  # the fixture's model trains with it: the weight is what this test changes
    monkeypatch.setattr(head, "mention_loss_weight", 0.0)
    sample = task.dataset("valid").collater([task.dataset("valid")[0]])
    losses, original = [], long_document.antecedent_loss

    def recorded(*args):
        losses.append(original(*args))
        return losses[-1]

    monkeypatch.setattr(long_document, "antecedent_loss", recorded)
    with torch.no_grad():
        whole = long_document.bounded_document_clusters(model, sample, 0.5, None, None, block_segments=10_000)[1]
        monkeypatch.setattr(head, "mention_loss", lambda *a: pytest.fail("mention loss computed at weight 0"))
        losses.clear()
        _, in_blocks = long_document.bounded_document_clusters(model, sample, 0.5, None, None, block_segments=1)
    assert len(losses) > 1
    torch.testing.assert_close(in_blocks, sum(losses))
    monkeypatch.undo()  # the exact head's loss at weight 0, computed independently of the bounded path
    monkeypatch.setattr(head, "mention_loss_weight", 0.0)
    with torch.no_grad():
        out, _ = model(sample["net_input"]["src_tokens"], coref=sample["coref"])
    torch.testing.assert_close(whole, out["loss"])  # float32's tolerances: the same losses, summed in blocks


def test_auto_prediction_is_exact_up_to_exact_prediction_max_words():
    """--coref-prediction auto predicts a document of exactly --exact-prediction-max-words words exactly, one more in
    bounded memory; bounded and exact are what they say whatever the length."""
    from types import SimpleNamespace

    from spanbert_plugin.coref.long_document import predicts_bounded

    auto = SimpleNamespace(coref_prediction="auto", exact_prediction_max_words=100)
    assert not predicts_bounded(auto, 100) and predicts_bounded(auto, 101)
    assert predicts_bounded(SimpleNamespace(coref_prediction="bounded", exact_prediction_max_words=100), 5)
    assert not predicts_bounded(SimpleNamespace(coref_prediction="exact", exact_prediction_max_words=100), 10_000)
