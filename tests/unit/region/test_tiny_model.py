"""The tiny model is built once into the cache folder, reused, and self-consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.region.tiny_model import ensure_tiny_model


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("cache"))


def test_shape_matches_the_catalogue_and_vllm_cpu_head_sizes(built: Path) -> None:
    config = json.loads((built / "config.json").read_text())
    spec = MODEL_CATALOGUE["tiny-llama"]
    assert config["hidden_size"] == spec.hidden == 128
    assert config["num_hidden_layers"] == spec.layers
    assert config["num_key_value_heads"] == spec.kv_heads
    assert config["hidden_size"] // config["num_attention_heads"] == spec.head_dim == 32
    assert config["max_position_embeddings"] == spec.max_context


def test_every_token_the_model_can_emit_decodes(built: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(built / "tokenizer.json"))
    config = json.loads((built / "config.json").read_text())
    assert config["vocab_size"] == tokenizer.get_vocab_size()
    assert 500 < tokenizer.get_vocab_size() <= 1000
    ids = tokenizer.encode("The grid's carbon intensity changes through the day.").ids
    assert tokenizer.decode(ids) == "The grid's carbon intensity changes through the day."


def test_chat_template_is_saved(built: Path) -> None:
    saved = (built / "chat_template.jinja").read_text() if (built / "chat_template.jinja").exists() else \
        json.loads((built / "tokenizer_config.json").read_text()).get("chat_template", "")
    assert "add_generation_prompt" in saved


def test_built_once_then_reused(built: Path) -> None:
    weights = built / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert ensure_tiny_model(built.parent.parent) == built
    assert weights.stat().st_mtime_ns == stamp
