"""Child process of test_coref_long_documents: predict one long synthetic document with a random-init tiny
coreference model and print its clusters' count and this process's peak resident memory (MB) as JSON.

    python tests/coref_memory_probe.py DATA WORDS MODE   (MODE: exact | bounded)
"""
import json
import os
import resource
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCE = "Anna told Ben that she liked the house and he agreed with her .".split()


def main(data: str, words: int, mode: str) -> None:
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from spanbert_plugin.core.tokenization import load_tokenizer
    from spanbert_plugin.coref.predict import document_clusters, words_sample

    torch.manual_seed(0)
    torch.set_num_threads(1)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", os.path.join(ROOT, "user_dir"), "--task", "coreference", "--criterion", "coreference",
        "--arch", "spanbert_tiny", "--encoder-layers", "1", "--coref-ffnn-size", "64", "--cpu",
        "--coref-prediction", mode, "--max-antecedent-distance", "300", "--entity-cache-size", "50"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model).eval()
    text = (SENTENCE * (words // len(SENTENCE) + 1))[:words]
    sentence_ids = np.cumsum([w == "." for w in text]) - np.array([w == "." for w in text])
    sample = words_sample(load_tokenizer(data), task.dictionary, task.meta, text, sentence_ids)
    with torch.no_grad():
        clusters = document_clusters(model, task, sample, 0.5, lambda line: None)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"words": words, "mode": mode, "clusters": len(clusters), "peak_mb": round(peak_mb, 1)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
