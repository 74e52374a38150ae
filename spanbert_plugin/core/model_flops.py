"""Achieved model FLOP/s of training (``tflops``) and their share of the device's dense peak (``mfu``).

Model FLOPs of one training update, in the convention of the PaLM paper's MFU (Chowdhery et al. 2022, app. B;
Megatron-LM counts the same way): forward + backward = 3 x the forward's 2 FLOPs per multiply-add, so per real
(non-padding) token

* 6 x the transformer layers' parameters (embeddings excluded),
* plus attention, 12 x layers x hidden x T, where T is the batch's sequence length (its padded length: the
  length attention runs over, as PaLM's T is the model's sequence length),
* plus, where a task predicts tokens over the vocabulary (pre-training's MLM and SBO), 6 x the head's
  parameters (its transform and the tied decoder, vocabulary x hidden) per predicted token.

Padding tokens, recomputation and the small fine-tuning heads (a few hidden x classes products) are not counted.
Every term comes from numbers the host already has (the batch's ``ntokens`` and shape, the criterion's counts):
counting costs the device nothing. fairseq logs the figure as it logs ``wps``: FLOPs of the updates since the
last log over the wall time.
"""
import logging
import re

import torch

logger = logging.getLogger(__name__)

# Dense (no sparsity) tensor-core peaks in TFLOP/s by the vendor's data sheets: half (fp16/bf16), tf32, fp32.
# Sheets that give a system's figures (HGX B200: 8 GPUs, GB200 NVL72: 72) are divided per GPU, and their
# with-sparsity tensor figures halved. Matched against torch.cuda.get_device_name() as whole words ("L4" is not
# "L40S", "A100" not "RTX A1000", "B200" not "GB200"), first match wins (PCIe before the SXM default).
PEAK_TFLOPS = (
    ("H100 PCIe", {"half": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"half": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("H100", {"half": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H800 PCIe", {"half": 756.0, "tf32": 378.0, "fp32": 51.2}),  # the H100's compute, less interconnect
    ("H800", {"half": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H200", {"half": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("GH200", {"half": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("B200", {"half": 2250.0, "tf32": 1125.0, "fp32": 75.0}),
    ("GB200", {"half": 2500.0, "tf32": 1250.0, "fp32": 80.0}),
    ("A100", {"half": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("A800", {"half": 312.0, "tf32": 156.0, "fp32": 19.5}),  # the A100's compute, less interconnect
    ("A10G", {"half": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("L40S", {"half": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("L40", {"half": 181.0, "tf32": 90.5, "fp32": 90.5}),
    ("L4", {"half": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("V100", {"half": 125.0, "tf32": None, "fp32": 15.7}),
)


def transformer_layer_parameters(model):
    """Parameters of the encoder's transformer layers (the ``BertStack``), or None for another model."""
    stack = getattr(getattr(model, "encoder", None), "encoder", None)
    if stack is None or not hasattr(stack, "layer"):
        return None
    return sum(p.numel() for p in stack.parameters())


def encoder_training_flops(model, sample, layer_parameters):
    """Model FLOPs of a training pass of the encoder over ``sample`` (host numbers only)."""
    stack = model.encoder.encoder
    hidden = model.encoder.embeddings.word_embeddings.embedding_dim
    tokens = sample["net_input"]["src_tokens"]
    real = sample.get("ntokens") or tokens.numel()
    return float(real) * (6.0 * layer_parameters + 12.0 * len(stack.layer) * hidden * tokens.size(-1))


def device_peak_tflops(device, precision):
    """The dense peak of ``device`` for ``precision`` ('half', 'tf32' or 'fp32'), or None when not in the table."""
    if device.type != "cuda":
        return None
    peaks = peaks_of_device_name(torch.cuda.get_device_name(device))
    return peaks.get(precision) if peaks else None


def peaks_of_device_name(name: str):
    """The table's entry for a CUDA device name, or None: the first key found in ``name`` as whole words."""
    for key, peaks in PEAK_TFLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return peaks
    return None


class FlopsLog:
    """What a task needs to log ``tflops`` and ``mfu``: the model's layer parameters and the peak to divide by."""

    def __init__(self, peak_tflops_option=0.0):
        self.peak_option = peak_tflops_option
        self.layer_parameters, self.peak, self.world_size = None, None, 1
        self._model_id = None

    def prepared_for(self, model) -> bool:
        return self._model_id == id(model)

    def prepare(self, model, precision, world_size):
        """Count the model's parameters and find the peak (once per model: see ``prepared_for``)."""
        self._model_id = id(model)
        self.layer_parameters = transformer_layer_parameters(model)
        self.world_size = max(1, world_size)
        device = next(model.parameters()).device
        self.peak = self.peak_option or device_peak_tflops(device, precision)
        if self.layer_parameters is not None and not self.peak:
            where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type.upper()
            logger.info(f"mfu is not logged: no dense {precision} peak known for {where} (set --peak-tflops)")

    def mfu(self, meters):
        """Per cent of the peak of all workers (fairseq sums every worker's FLOPs into ``tflops``)."""
        if "tflops" not in meters:
            return None
        return round(100.0 * float(meters["tflops"].avg) / (self.peak * self.world_size), 2)
