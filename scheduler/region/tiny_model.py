"""The tiny Llama every local region serves: random weights and a locally trained BPE
tokenizer, built once into the cache folder and reused (no model hub, no download).

Shape (see ``MODEL_CATALOGUE["tiny-llama"]``): hidden 128, 4 heads of 32 (a head size vLLM's
CPU attention accepts), 2 layers, vocabulary about 1000, context 2048. About 0.6 M
parameters, 1.2 MB on disk, built in a few seconds.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from scheduler.config.loader import PROJECT_DIR

log = logging.getLogger(__name__)

TINY_MODEL = "tiny-llama"
# Bump when the recipe below changes so that old caches are rebuilt.
RECIPE_VERSION = 3
_MARKER = "scheduler-tiny-model.json"

# A few paragraphs to train the tokenizer on: varied enough for ~1000 merges.
_CORPUS = """\
Operators run language model inference in several regions. Each region has pools of
accelerators of different kinds, sits on a different electricity grid, and is bound by
different law. For every request the scheduler answers where it should run so that it meets
its compliance rules, its latency objective and its quality floor, and among the places that
do, costs the least energy and carbon. It then runs it there and streams the answer back.

The grid's carbon intensity changes through the day: wind and sun push it down, gas and coal
push it up. A signal that is too old is never used as if it were fresh; the scorer abstains
and the ranking falls back to the order of performance and reliability the policy names.

Energy of a request is not tokens times a constant. Prefill reads the prompt once and is bound
by arithmetic; decode reads the weights once per step for the whole batch and the cache of
keys and values for every sequence. A prefix cache hit removes the prefill of the reused
tokens but not the cost of each step. Higher memory bandwidth lowers the energy of decoding.

Hello! How are you today? Could you summarise this article in three sentences, please?
Write a short poem about the sea, the mountains, the rivers and the forests of the north.
The quick brown fox jumps over the lazy dog while the cat sleeps on the warm windowsill.
Translate the following paragraph into French, German, Spanish, Italian and Japanese.
Explain the difference between a list and a tuple in Python, with examples of each one.
def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
SELECT region, SUM(energy_j) FROM receipts GROUP BY region ORDER BY 2 DESC LIMIT 10;
0 1 2 3 4 5 6 7 8 9 10 100 1000 2023 2026 3.14 42 -7 +1 50% $9.99 #tag @user
"""

# A minimal chat template so that /v1/chat/completions works on the tiny model.
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class TinyModelShape:
    vocab_size: int = 1000
    hidden: int = 128
    heads: int = 4
    layers: int = 2
    intermediate: int = 256
    max_context: int = 2048
    seed: int = 0


def cache_dir() -> Path:
    """Where built artefacts live: ``$SCHEDULER_CACHE`` or ``<project>/var`` (gitignored)."""
    return Path(os.environ.get("SCHEDULER_CACHE") or PROJECT_DIR / "var")


def tiny_model_dir(root: Path | None = None) -> Path:
    return (root or cache_dir()) / "models" / TINY_MODEL


def ensure_tiny_model(root: Path | None = None, shape: TinyModelShape | None = None) -> Path:
    """The tiny model's folder, built first if it is missing or from an older recipe."""
    shape = shape or TinyModelShape()
    target = tiny_model_dir(root)
    wanted = {"recipe": RECIPE_VERSION, **shape.__dict__}
    marker = target / _MARKER
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return target
    log.info("building the tiny model into %s", target)
    target.mkdir(parents=True, exist_ok=True)
    _build(target, shape)
    # Written last: a build interrupted half-way is redone next time.
    marker.write_text(json.dumps(wanted))
    return target


def _build(target: Path, shape: TinyModelShape) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=shape.max_context,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(target)

    torch.manual_seed(shape.seed)
    config = LlamaConfig(
        # The trained vocabulary (a few below the target on this small corpus): the model
        # must never emit an id the tokenizer cannot decode.
        vocab_size=len(fast),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=shape.max_context,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(target)  # type: ignore[no-untyped-call]
