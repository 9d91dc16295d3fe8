"""``ocr-rec``, ``ocr-cls``, ``ocr-det``: the PP-OCR models shipped inside ``rapidocr-onnxruntime``, with labelled
text rendered from matplotlib's DejaVu fonts.

Every sample is a pure function of (split, index): the words, font, size, colours and margins come from a seeded
generator, so the sets are exact, reproducible and need no download. Preprocessing copies rapidocr's
(``cv2.resize`` to height 48 keeping the aspect ratio, BGR, ``(x/255 - 0.5) / 0.5``, zero padding on the right).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import threading
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from workbench.artifact import JsonObject
from workbench.errors import WorkbenchError
from workbench.zoo.base import Feed, Label, MetricResult, Outputs, Prediction, ZooEntry, sample_rng

if TYPE_CHECKING:
    from PIL import ImageFont
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

REC_HEIGHT, REC_WIDTH = 48, 320
CLS_HEIGHT, CLS_WIDTH = 48, 192
DET_HEIGHT, DET_WIDTH = 384, 512  # multiples of 32, as the DB detector needs
INPUT_NAME = "x"

WORDS = """
the of and to in is was for on are with as his they be at one have this from or had by hot word but what some we
can out other were all there when up use your how said an each she which do their time if will way about many then
them write would like so these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too same tell does set
three want air well also play small end put home read hand port large spell add even land here must big high such
follow act why ask men change went light kind off need house picture try us again animal point mother world near
build self earth father head stand own page should country found answer school grow study still learn plant cover
food sun four between state keep eye never last let thought city tree cross farm hard start might story saw far sea
draw left late run while press close night real life few north open seem together next white children begin got walk
example ease paper group always music those both mark often letter until mile river car feet care second book carry
took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main
engine tensor kernel layer model batch stream latency graph float quantize calibrate profile optimize export
""".split()
PUNCTUATION = [".", ",", ":", "!", "?", ";"]
FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSansMono.ttf",
)


# ------------------------------------------------------------------------------------------- rendering
@functools.lru_cache(maxsize=1)
def font_folder() -> Path:
    import matplotlib

    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    if not (folder / FONT_FILES[0]).is_file():
        raise WorkbenchError(
            f"{folder}: matplotlib's DejaVu fonts are missing.", expected="a matplotlib install with mpl-data/fonts/ttf"
        )
    return folder


@functools.lru_cache(maxsize=64)
def _font(file_name: str, size: int) -> ImageFont.FreeTypeFont:
    from PIL import ImageFont

    return ImageFont.truetype(str(font_folder() / file_name), size)


def random_text(rng: np.random.Generator, max_words: int = 3) -> str:
    """A short English-like line: words in mixed case, sometimes a number, a price or a punctuation mark."""
    parts: list[str] = []
    for _ in range(int(rng.integers(1, max_words + 1))):
        kind = rng.random()
        if kind < 0.12:
            parts.append(str(int(rng.integers(0, 10 ** int(rng.integers(1, 5))))))
        elif kind < 0.17:
            parts.append(f"${rng.integers(1, 100)}.{rng.integers(0, 100):02d}")
        else:
            word = str(WORDS[int(rng.integers(len(WORDS)))])
            style = rng.random()
            parts.append(word.capitalize() if style < 0.3 else word.upper() if style < 0.4 else word)
    text = " ".join(parts)
    if rng.random() < 0.2:
        text += str(PUNCTUATION[int(rng.integers(len(PUNCTUATION)))])
    return text


def _colours(rng: np.random.Generator) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    background = tuple(int(v) for v in rng.integers(200, 256, 3))
    foreground = tuple(int(v) for v in rng.integers(0, 70, 3))
    return foreground, background  # type: ignore[return-value]


def render_line(rng: np.random.Generator, max_ratio: float = REC_WIDTH / REC_HEIGHT) -> tuple[np.ndarray, str]:
    """A cropped text-line image (H, W, 3) uint8 in BGR order, as cv2 reads it, and its exact text.

    Words are dropped until the crop's width/height ratio fits ``max_ratio`` so no line is squeezed.
    """
    from PIL import Image, ImageDraw

    font = _font(FONT_FILES[int(rng.integers(len(FONT_FILES)))], int(rng.integers(26, 44)))
    foreground, background = _colours(rng)
    pad_x, pad_y = int(rng.integers(3, 14)), int(rng.integers(2, 9))
    text = random_text(rng)
    while True:
        left, top, right, bottom = font.getbbox(text)
        width, height = right - left + 2 * pad_x, bottom - top + 2 * pad_y
        if width / height <= max_ratio or " " not in text:
            break
        text = text.rsplit(" ", 1)[0]
    if width / height > max_ratio:  # one long word: cut letters, keep it a real label
        while len(text) > 1 and (font.getbbox(text)[2] - left + 2 * pad_x) / height > max_ratio:
            text = text[:-1]
        left, top, right, bottom = font.getbbox(text)
        width, height = right - left + 2 * pad_x, bottom - top + 2 * pad_y
    image = Image.new("RGB", (int(width), int(height)), background)
    ImageDraw.Draw(image).text((pad_x - left, pad_y - top), text, font=font, fill=foreground)
    return np.ascontiguousarray(np.asarray(image)[:, :, ::-1]), text


def render_page(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A DET_HEIGHT x DET_WIDTH page (BGR uint8) with 3-6 text lines; returns (page, boxes [K,4] x0,y0,x1,y1, texts)."""
    from PIL import Image, ImageDraw

    foreground, background = _colours(rng)
    page = Image.new("RGB", (DET_WIDTH, DET_HEIGHT), background)
    draw = ImageDraw.Draw(page)
    boxes: list[list[int]] = []
    texts: list[str] = []
    y = int(rng.integers(8, 40))
    for _ in range(int(rng.integers(3, 7))):
        font = _font(FONT_FILES[int(rng.integers(len(FONT_FILES)))], int(rng.integers(18, 38)))
        text = random_text(rng, max_words=4)
        left, top, right, bottom = (int(v) for v in draw.textbbox((0, 0), text, font=font))
        while right - left > DET_WIDTH - 24 and " " in text:
            text = text.rsplit(" ", 1)[0]
            left, top, right, bottom = (int(v) for v in draw.textbbox((0, 0), text, font=font))
        if y + (bottom - top) > DET_HEIGHT - 8 or right - left > DET_WIDTH - 24:
            break
        x = int(rng.integers(12, DET_WIDTH - 12 - (right - left) + 1))
        origin = (x - left, y - top)
        draw.text(origin, text, font=font, fill=foreground)
        box = [int(v) for v in draw.textbbox(origin, text, font=font)]
        # the ground-truth box spans the line's full height (cap height to descender), as line annotations
        # do, so a short lowercase word like "sun" is not judged against its x-height alone
        line_extent = draw.textbbox(origin, "Hg", font=font)
        box[1], box[3] = min(box[1], int(line_extent[1])), max(box[3], int(line_extent[3]))
        boxes.append(box)
        texts.append(text)
        # a gap of at least 60% of the line height keeps neighbouring lines apart, as on a real page
        y = box[3] + int((bottom - top) * rng.uniform(0.6, 1.6))
    return np.ascontiguousarray(np.asarray(page)[:, :, ::-1]), np.asarray(boxes, dtype=np.int64).reshape(-1, 4), texts


# ----------------------------------------------------------------------------------------- preprocess
def resize_normalize(image_bgr: np.ndarray, height: int, width: int) -> np.ndarray:
    """rapidocr's rec/cls preprocessing: resize to ``height`` keeping aspect (capped at ``width``), normalise to
    [-1, 1], zero-pad on the right to ``width``. Returns [3, height, width] float32."""
    return normalize_line(resize_line(image_bgr, height, width), width)


def resize_line(image_bgr: np.ndarray, height: int, width: int) -> np.ndarray:
    """The first half of :func:`resize_normalize`: the image resized to ``height`` keeping its aspect (capped at
    ``width``), as it came from OpenCV."""
    import cv2

    image = np.asarray(image_bgr)
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    if image.ndim != 3 or image.shape[2] != 3:
        raise WorkbenchError(
            f"a text image of shape {image.shape} cannot be preprocessed.", expected="an (H, W, 3) BGR uint8 image"
        )
    h, w = image.shape[:2]
    resized_w = min(width, int(math.ceil(height * w / float(h))))
    return cv2.resize(image, (resized_w, height))


def normalize_line(resized: np.ndarray, width: int) -> np.ndarray:
    """The second half of :func:`resize_normalize`: [-1, 1], channels first, zero-padded on the right to ``width``."""
    height, resized_w = resized.shape[:2]
    scaled = resized.astype(np.float32).transpose(2, 0, 1) / 255.0
    padded = np.zeros((3, height, width), dtype=np.float32)
    padded[:, :, :resized_w] = (scaled - 0.5) / 0.5
    return padded


def normalize_page(page_bgr: np.ndarray) -> np.ndarray:
    """rapidocr's det normalisation (mean 0.5, std 0.5 on x/255) -> [3, H, W] float32; H, W must be multiples of 32."""
    page = np.asarray(page_bgr)
    if page.ndim != 3 or page.shape[2] != 3 or page.shape[0] % 32 or page.shape[1] % 32:
        raise WorkbenchError(
            f"a page of shape {page.shape} cannot be fed to the detector.",
            expected="an (H, W, 3) BGR image with H and W multiples of 32",
        )
    return ((page.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1).copy()


def _load_bgr(image: str | Path | np.ndarray) -> np.ndarray:
    """A path or an array -> (H, W, 3) BGR uint8."""
    if isinstance(image, (str, Path)):
        import cv2

        from workbench._arrays import image_size

        image_size(image)  # refuses an unreadable or oversized image before OpenCV decodes it
        loaded = cv2.imread(str(image), cv2.IMREAD_COLOR)
        if loaded is None:
            raise WorkbenchError(f"{image}: not a readable image file.", expected="a PNG/JPEG image")
        return loaded
    return np.asarray(image)


# ------------------------------------------------------------------------------------------ the models
def rapidocr_model(file_name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise WorkbenchError(
            "the PP-OCR zoo models come from the rapidocr-onnxruntime package, which is not installed.",
            hint="pip install rapidocr-onnxruntime==1.4.4",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / file_name
    if not path.is_file():
        raise WorkbenchError(
            f"{path}: missing from the installed rapidocr-onnxruntime.",
            expected="rapidocr-onnxruntime 1.4.4 with its models/ folder",
        )
    return path


def levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


@dataclasses.dataclass
class _SampleMemo:
    samples: dict[tuple[str, int], tuple[np.ndarray, Label]] = dataclasses.field(default_factory=dict)
    bytes: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class _OcrEntry(ZooEntry):
    source_file: str
    source = "rapidocr-onnxruntime 1.4.4 (PaddleOCR PP-OCR models)"
    license = "Apache-2.0 (models), Bitstream Vera / DejaVu font license (rendered data)"
    generated_data = True  # lines and pages rendered from (seed, index)
    # A search or a journey scores every variant on the same samples, and rendering them was a tenth of a journey's
    # time (profiled 2026-12-06: 2.0 s of `workbench demo`'s 22.6 s; a line 0.7 ms to render and resize, 0.1 ms to
    # normalize; a page 5.4 ms and 2.0 ms): each sample's uint8 image before normalization (resized lines, whole
    # pages; the same for every variant) and its label are kept in memory, up to this many bytes per entry; the
    # float input is made from it exactly as before. (EfficientNet-Lite0 keeps its crops too, in memory and in a file
    # of the cache folder, EfficientNetLite0Entry._resized_crop: a crop costs ~15 ms, worth keeping across processes.)
    SAMPLE_MEMO_BYTES = 256 << 20

    @abstractmethod
    def _render(self, split: str, index: int) -> tuple[np.ndarray, Label]:
        """The sample's uint8 image before normalisation, and its label (uncached)."""

    @abstractmethod
    def _normalize(self, image: np.ndarray) -> np.ndarray:
        """The model's float input from :meth:`_render`'s image."""

    def _sample(self, split: str, index: int) -> tuple[Feed, Label]:
        memo = self._sample_memo
        found = memo.samples.get((split, index))
        if found is None:
            image, label = self._render(split, index)
            arrays = [a for a in (image, label) if isinstance(a, np.ndarray)]
            for array in arrays:  # shared by every later use: nobody may change them in place
                array.setflags(write=False)
            found = (image, label)
            size = sum(a.nbytes for a in arrays)
            with memo.lock:
                if memo.bytes + size <= self.SAMPLE_MEMO_BYTES:
                    memo.samples[(split, index)] = found
                    memo.bytes += size
        return {INPUT_NAME: self._normalize(found[0])}, found[1]

    @functools.cached_property
    def _sample_memo(self) -> _SampleMemo:
        return _SampleMemo()

    def _materialize(self, target: Path) -> JsonObject:
        shutil.copyfile(rapidocr_model(self.source_file), target)
        return {"copied_from": self.source_file}

    def _source_fingerprint(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"rapidocr-onnxruntime=={version('rapidocr-onnxruntime')}"
        except PackageNotFoundError:
            return "rapidocr-onnxruntime missing"


class OcrRecEntry(_OcrEntry):
    name = "ocr-rec"
    description = "PP-OCRv4 text recogniser (CNN + attention, CTC over 6,625 symbols) on rendered text lines"
    task = "text recognition"
    metric_name = "exact_match"
    source_file = "ch_PP-OCRv4_rec_infer.onnx"
    split_sizes = {"calibration": 128, "evaluation": 300}
    profiles = {
        INPUT_NAME: ((1, 3, REC_HEIGHT, REC_WIDTH), (8, 3, REC_HEIGHT, REC_WIDTH), (32, 3, REC_HEIGHT, REC_WIDTH))
    }
    metric_output = OUTPUT = "softmax_11.tmp_0"

    @functools.cached_property
    def characters(self) -> list[str]:
        """CTC symbol table as rapidocr builds it: 'blank' at 0, the ONNX metadata 'character' list, then space."""
        import onnx

        proto = onnx.load(str(rapidocr_model(self.source_file)), load_external_data=False)
        metadata = {prop.key: prop.value for prop in proto.metadata_props}
        return ["blank", *metadata["character"].splitlines(), " "]

    def raw_image(self, split: str, index: int) -> np.ndarray:
        """The sample's text-line image before preprocessing (BGR uint8)."""
        return render_line(sample_rng(split, index, salt=1))[0]

    def _render(self, split: str, index: int) -> tuple[np.ndarray, Label]:
        line, text = render_line(sample_rng(split, index, salt=1))
        return resize_line(line, REC_HEIGHT, REC_WIDTH), text

    def _normalize(self, image: np.ndarray) -> np.ndarray:
        return normalize_line(image, REC_WIDTH)

    def preprocess_images(self, images: Sequence[str | Path | np.ndarray]) -> Feed:
        """Cropped text-line images (paths, or BGR arrays as cv2 reads them) -> one feed, rapidocr's preprocessing."""
        return {INPUT_NAME: np.stack([resize_normalize(_load_bgr(image), REC_HEIGHT, REC_WIDTH) for image in images])}

    def decode(self, probabilities: np.ndarray) -> list[str]:
        """CTC greedy decoding of [N, T, C] scores: argmax, merge repeats, drop blanks (index 0)."""
        best = np.asarray(probabilities).argmax(axis=2)
        table = self.characters
        texts = []
        for row in best:
            keep = np.ones(len(row), dtype=bool)
            keep[1:] = row[1:] != row[:-1]
            keep &= row != 0
            texts.append("".join(table[i] if i < len(table) else "" for i in row[keep]))
        return texts

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Prediction]:
        return self.decode(self._output(outputs, self.metric_output))

    def _metric(self, predictions: list[Prediction], labels: list[Label], indices: list[int]) -> MetricResult:
        texts, truths = cast("list[str]", predictions), cast("list[str]", labels)  # decoded lines and their labels
        exact = [pred.strip() == truth for pred, truth in zip(texts, truths)]
        edits = sum(levenshtein(pred.strip(), truth) for pred, truth in zip(texts, truths))
        characters = sum(len(truth) for truth in truths)
        mistakes = [[int(indices[i]), labels[i], predictions[i]] for i, ok in enumerate(exact) if not ok]
        return MetricResult(
            name=self.metric_name,
            value=float(np.mean(exact)) if exact else float("nan"),
            higher_is_better=True,
            n_samples=len(exact),
            scores=[float(e) for e in exact],
            details={
                "cer": edits / max(characters, 1),
                "exact": int(sum(exact)),
                "characters": characters,
                "first_errors": mistakes[:10],
            },
        )


class OcrClsEntry(_OcrEntry):
    name = "ocr-cls"
    description = "PP-OCR mobile v2.0 text-orientation classifier (upright vs 180 degrees) on rendered text lines"
    task = "text orientation classification (0 / 180 degrees)"
    metric_name = "top1_accuracy"
    source_file = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    split_sizes = {"calibration": 128, "evaluation": 400}
    profiles = {
        INPUT_NAME: ((1, 3, CLS_HEIGHT, CLS_WIDTH), (8, 3, CLS_HEIGHT, CLS_WIDTH), (64, 3, CLS_HEIGHT, CLS_WIDTH))
    }
    metric_output = OUTPUT = "save_infer_model/scale_0.tmp_1"

    def _materialize(self, target: Path) -> JsonObject:
        """Copy the classifier, fixing its input shape for TensorRT.

        The shipped file declares x as [-1, 3, "?", "?"]: TensorRT reads two dims with the same symbolic name as one
        dimension, so H (48) and W (192) would be forced equal and the build fails. rapidocr only ever feeds 48x192,
        so the cached copy pins H and W to 48 and 192 and names the batch dim "batch" (kept dynamic).
        """
        import onnx

        proto = onnx.load(str(rapidocr_model(self.source_file)))
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        before = [d.dim_param or d.dim_value for d in dims]
        dims[0].dim_param = "batch"
        dims[2].dim_value = CLS_HEIGHT
        dims[3].dim_value = CLS_WIDTH
        out_dims = proto.graph.output[0].type.tensor_type.shape.dim
        out_dims[0].dim_param = "batch"
        onnx.checker.check_model(proto)
        onnx.save(proto, str(target))
        return {
            "copied_from": self.source_file,
            "input_shape_fix": {"before": before, "after": ["batch", 3, CLS_HEIGHT, CLS_WIDTH]},
        }

    def raw_image(self, split: str, index: int) -> np.ndarray:
        """The sample's text-line image before preprocessing (BGR uint8): even indices upright, odd ones rotated
        by 180 degrees, so every prefix has balanced labels."""
        line, _ = render_line(sample_rng(split, index, salt=2))
        return np.ascontiguousarray(line[::-1, ::-1]) if index % 2 else line

    def _render(self, split: str, index: int) -> tuple[np.ndarray, Label]:
        return resize_line(self.raw_image(split, index), CLS_HEIGHT, CLS_WIDTH), index % 2

    def _normalize(self, image: np.ndarray) -> np.ndarray:
        return normalize_line(image, CLS_WIDTH)

    def preprocess_images(self, images: Sequence[str | Path | np.ndarray]) -> Feed:
        """Cropped text-line images (paths or BGR arrays) -> one feed, rapidocr's classifier preprocessing."""
        return {INPUT_NAME: np.stack([resize_normalize(_load_bgr(image), CLS_HEIGHT, CLS_WIDTH) for image in images])}

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Prediction]:
        return list(self._output(outputs, self.metric_output).argmax(axis=1))

    def _metric(self, predictions: list[Prediction], labels: list[Label], indices: list[int]) -> MetricResult:
        from workbench.zoo.digits import classification_metric

        return classification_metric(self.metric_name, predictions, labels)


class OcrDetEntry(_OcrEntry):
    name = "ocr-det"
    description = "PP-OCRv4 DB text detector on rendered 384x512 pages (rapidocr's DB post-processing)"
    task = "text detection"
    metric_name = "line_recall@iou0.5"
    source_file = "ch_PP-OCRv4_det_infer.onnx"
    recipe_version = 2  # 2: the metric is the mean of per-page recalls (stored metrics of 1 were over all lines)
    split_sizes = {"calibration": 32, "evaluation": 60}
    profiles = {
        INPUT_NAME: ((1, 3, DET_HEIGHT, DET_WIDTH), (8, 3, DET_HEIGHT, DET_WIDTH), (16, 3, DET_HEIGHT, DET_WIDTH))
    }
    metric_output = OUTPUT = "sigmoid_0.tmp_0"
    IOU_THRESHOLD = 0.5

    def raw_image(self, split: str, index: int) -> np.ndarray:
        """The sample's page before preprocessing (BGR uint8)."""
        return render_page(sample_rng(split, index, salt=3))[0]

    def _render(self, split: str, index: int) -> tuple[np.ndarray, Label]:
        page, boxes, _ = render_page(sample_rng(split, index, salt=3))
        return page, boxes

    def _normalize(self, image: np.ndarray) -> np.ndarray:
        return normalize_page(image)

    def preprocess_images(self, images: Sequence[str | Path | np.ndarray]) -> Feed:
        """Page images (paths or BGR arrays, sides multiples of 32) -> one feed, rapidocr's det normalisation."""
        return {INPUT_NAME: np.stack([normalize_page(_load_bgr(image)) for image in images])}

    @functools.cached_property
    def _postprocess(self) -> DBPostProcess:
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

        # rapidocr's own settings (config.yaml, Det section)
        return DBPostProcess(
            thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6, score_mode="fast", use_dilation=True
        )

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Prediction]:
        maps = self._output(outputs, self.metric_output)
        results = []
        for probability in maps:
            boxes, _ = self._postprocess(probability[None], probability.shape[-2:])
            quads = np.asarray(boxes, dtype=np.float32).reshape(-1, 4, 2)
            results.append(
                np.concatenate([quads.min(axis=1), quads.max(axis=1)], axis=1)
                if len(quads)
                else np.zeros((0, 4), np.float32)
            )
        return results

    def _metric(self, predictions: list[Prediction], labels: list[Label], indices: list[int]) -> MetricResult:
        """Line recall at IoU 0.5, averaged over pages: each page scores the share of its text lines a predicted
        box matches (greedy one-to-one, best pairs first), so the metric is a mean of per-page scores like every
        other zoo metric, with an interval and paired comparisons (a page without lines scores 1: none missed).
        The details keep the counts over all lines: recall over lines, precision and F1."""
        matched = total_truth = total_predicted = 0
        ious: list[float] = []
        page_recall: list[float] = []
        boxes = cast("list[np.ndarray]", predictions), cast("list[np.ndarray]", labels)  # per page: [K, 4] boxes
        for predicted, truth in zip(*boxes):
            total_truth += len(truth)
            total_predicted += len(predicted)
            found = 0
            if len(truth) and len(predicted):
                iou = box_iou(np.asarray(truth, np.float64), np.asarray(predicted, np.float64))
                for flat in np.argsort(-iou, axis=None):
                    t, p = np.unravel_index(flat, iou.shape)
                    if iou[t, p] < self.IOU_THRESHOLD:
                        break
                    if np.isfinite(iou[t, p]):
                        found += 1
                        ious.append(float(iou[t, p]))
                        iou[t, :] = -np.inf
                        iou[:, p] = -np.inf
            matched += found
            page_recall.append(found / len(truth) if len(truth) else 1.0)
        recall = matched / max(total_truth, 1)
        precision = matched / max(total_predicted, 1)
        return MetricResult(
            name=self.metric_name,
            value=float(np.mean(page_recall)) if page_recall else float("nan"),
            higher_is_better=True,
            n_samples=len(predictions),
            details={
                "text_lines": total_truth,
                "detected_boxes": total_predicted,
                "matched": matched,
                "recall_over_all_lines": recall,
                "precision": precision,
                "f1": 2 * precision * recall / max(precision + recall, 1e-12),
                "mean_matched_iou": float(np.mean(ious)) if ious else 0.0,
            },
            scores=page_recall,
        )


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of axis-aligned boxes [K,4] x [M,4] given as x0, y0, x1, y1."""
    x0 = np.maximum(a[:, None, 0], b[None, :, 0])
    y0 = np.maximum(a[:, None, 1], b[None, :, 1])
    x1 = np.minimum(a[:, None, 2], b[None, :, 2])
    y1 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)
