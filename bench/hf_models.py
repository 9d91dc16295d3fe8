"""Tiny randomly initialised Hugging Face models (transformers, torch: the dev extras), exported as users export them
(`torch.onnx.export`, TorchScript exporter, opset 17, dynamic batch; text models also a dynamic sequence), for the
unseen-model survey: `python bench/hf_models.py OUTDIR [NAME ...]`, then `MODELS_DIR=OUTDIR bench/unseen_models.sh
OUT`. Results: bench/results/unseen_models_2026-12-06b.md."""

import sys
import warnings
from pathlib import Path

import torch
import transformers as T

warnings.filterwarnings("ignore")
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
names = sys.argv[2:] or None


def generic(name, model, inputs, outputs):
    """``inputs``: {name: (tensor, dynamic axes {index: name})}; ``outputs``: {name: (attribute, dynamic axes)}."""
    model.eval()

    class Wrap(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            result = self.model(**dict(zip(inputs, args)))
            return tuple(getattr(result, attribute) for attribute, _ in outputs.values())

    torch.onnx.export(
        Wrap(model),
        tuple(tensor for tensor, _ in inputs.values()),
        out / f"{name}.onnx",
        input_names=list(inputs),
        output_names=list(outputs),
        dynamic_axes={n: axes for n, (_, axes) in inputs.items()} | {n: axes for n, (_, axes) in outputs.items()},
        opset_version=17,
        dynamo=False,
    )


def _ids(length=16, vocab=100):
    return torch.randint(0, vocab, (2, length))


BATCH, SEQ = {0: "batch"}, {0: "batch", 1: "sequence"}
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)  # every transformer


def vision(name, model, size=64):
    """An image classifier or segmenter: pixel_values [N, 3, size, size] -> logits."""
    generic(name, model, {"pixel_values": (torch.randn(2, 3, size, size), BATCH)}, {"logits": ("logits", BATCH)})


def text(name, model, with_mask=True, out_axes=BATCH):
    """A text model: input_ids (and attention_mask) [N, sequence] -> logits."""
    inputs = {"input_ids": (_ids(), SEQ)}
    if with_mask:
        inputs["attention_mask"] = (torch.ones(2, 16, dtype=torch.long), SEQ)
    generic(name, model, inputs, {"logits": ("logits", out_axes)})


builders = {
    "hf-resnet": lambda: vision(
        "hf-resnet",
        T.ResNetForImageClassification(
            T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1], num_labels=10)
        ),
    ),
    "hf-mobilenetv2": lambda: vision(
        "hf-mobilenetv2",
        T.MobileNetV2ForImageClassification(T.MobileNetV2Config(depth_multiplier=0.35, num_labels=10, image_size=64)),
    ),
    "hf-convnext": lambda: vision(
        "hf-convnext",
        T.ConvNextForImageClassification(
            T.ConvNextConfig(hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1], num_labels=10)
        ),
    ),
    "hf-vit": lambda: vision(
        "hf-vit",
        T.ViTForImageClassification(T.ViTConfig(image_size=64, patch_size=16, **SMALL, num_labels=10)),
    ),
    "hf-swin": lambda: vision(
        "hf-swin",
        T.SwinForImageClassification(
            T.SwinConfig(
                image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=10
            )
        ),
    ),
    "hf-segformer": lambda: vision(
        "hf-segformer",
        T.SegformerForSemanticSegmentation(
            T.SegformerConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                num_attention_heads=[1, 2],
                decoder_hidden_size=32,
                num_labels=4,
                patch_sizes=[7, 3],
                strides=[4, 2],
                mlp_ratios=[2, 2],
            )
        ),
    ),
    "hf-distilbert": lambda: text(
        "hf-distilbert",
        T.DistilBertForSequenceClassification(
            T.DistilBertConfig(
                vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64, num_labels=3
            )
        ),
    ),
    "hf-gpt2": lambda: text(
        "hf-gpt2",
        T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64)),
        with_mask=False,
        out_axes=SEQ,
    ),
    "hf-wav2vec2": lambda: generic(
        "hf-wav2vec2",
        T.Wav2Vec2ForSequenceClassification(
            T.Wav2Vec2Config(
                vocab_size=32,
                **SMALL,
                conv_dim=(16, 16),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=2,
                num_labels=3,
            )
        ),
        {"input_values": (torch.randn(2, 1600), {0: "batch", 1: "samples"})},
        {"logits": ("logits", BATCH)},
    ),
    "hf-clip": lambda: generic(
        "hf-clip",
        T.CLIPModel(
            T.CLIPConfig(
                text_config=dict(vocab_size=100, **SMALL, max_position_embeddings=32),
                vision_config=dict(**SMALL, image_size=32, patch_size=8),
                projection_dim=16,
            )
        ),
        {
            "input_ids": (_ids(), SEQ),
            "pixel_values": (torch.randn(2, 3, 32, 32), BATCH),
            "attention_mask": (torch.ones(2, 16, dtype=torch.long), SEQ),
        },
        {"logits_per_image": ("logits_per_image", {0: "images", 1: "texts"})},
    ),
    "hf-t5": lambda: generic(
        "hf-t5",
        T.T5ForConditionalGeneration(
            T.T5Config(
                vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, decoder_start_token_id=0
            )
        ),
        {
            "input_ids": (_ids(), SEQ),
            "attention_mask": (torch.ones(2, 16, dtype=torch.long), SEQ),
            "decoder_input_ids": (_ids(8), {0: "batch", 1: "target"}),
        },
        {"logits": ("logits", {0: "batch", 1: "target"})},
    ),
    "hf-deberta": lambda: generic(
        "hf-deberta",
        T.DebertaV2ForSequenceClassification(
            T.DebertaV2Config(vocab_size=100, **SMALL, max_position_embeddings=64, num_labels=3)
        ),
        {"input_ids": (_ids(), SEQ), "attention_mask": (torch.ones(2, 16, dtype=torch.long), SEQ)},
        {"logits": ("logits", BATCH)},
    ),
    "hf-mobilevit": lambda: vision(
        "hf-mobilevit",
        T.MobileViTForImageClassification(
            T.MobileViTConfig(
                image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 80], num_labels=10
            )
        ),
    ),
    "hf-yolos": lambda: generic(
        "hf-yolos",
        T.YolosForObjectDetection(
            T.YolosConfig(image_size=[64, 64], patch_size=16, **SMALL, num_detection_tokens=10, num_labels=5)
        ),
        {"pixel_values": (torch.randn(2, 3, 64, 64), BATCH)},
        {"logits": ("logits", BATCH), "pred_boxes": ("pred_boxes", BATCH)},
    ),
}
# Full-size architectures (random init, the configs' defaults): the scale users bring (ResNet-50 98 MB, ViT-B/16
# 330 MB, BERT-base 418 MB); exported only when named, e.g. `python bench/hf_models.py DIR hf-resnet50 hf-vit-base`.
full_size = {
    "hf-resnet50": lambda: vision("hf-resnet50", T.ResNetForImageClassification(T.ResNetConfig()), size=224),
    "hf-vit-base": lambda: vision("hf-vit-base", T.ViTForImageClassification(T.ViTConfig()), size=224),
    "hf-bert-base": lambda: generic(
        "hf-bert-base",
        T.BertForSequenceClassification(T.BertConfig(num_labels=2)),
        {
            "input_ids": (torch.randint(0, 30522, (2, 128)), SEQ),
            "attention_mask": (torch.ones(2, 128, dtype=torch.long), SEQ),
        },
        {"logits": ("logits", BATCH)},
    ),
}
unknown = sorted(set(names or ()) - set(builders) - set(full_size))
if unknown:
    print(f"error: unknown model name(s) {unknown}; known: {', '.join([*builders, *full_size])}", file=sys.stderr)
    sys.exit(2)
chosen = {n: b for n, b in (builders | full_size).items() if n in names} if names else builders
for name, build in chosen.items():
    try:
        torch.manual_seed(0)  # each model's weights and sample input from the same seed, whichever are asked for
        build()
        print(name, "exported")
    except Exception as e:
        print(name, "EXPORT FAILED", type(e).__name__, str(e)[:300])
