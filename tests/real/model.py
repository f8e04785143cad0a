"""The tiny model that the real engines serve in tests, built here, never fetched from a hub.

A Llama-architecture causal LM (2 layers, hidden size 64, 2 heads of 32: vLLM's CPU attention
needs a head size of at least 32) with random weights from a fixed seed, saved as safetensors
with config.json and generation_config.json, and a byte-level BPE tokenizer trained on a fixed
corpus written below, with a chat template that renders tools and the `<tool_call>` tags that
vLLM's `hermes` tool parser looks for. Everything is deterministic: the same source builds the
same files, and the build is cached under ~/.cache/narwhal/models/<hash of this file>/.

Importing this module needs only the standard library (the tests do, to find the model);
building it needs numpy, safetensors and tokenizers, which the engines' venv has:

    .venv-engines/bin/python tests/real/model.py [DIR]    # builds, prints the directory
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

NAME = "narwhal-tiny"
SEED = 20261201
MAX_POSITIONS = 8192
HIDDEN = 64
HEADS = 2
HEAD_DIM = 32
LAYERS = 2
INTERMEDIATE = 128
VOCAB_TARGET = 1024
FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# Special tokens first, so their IDs are fixed (0..4) whatever the corpus learns.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
EOS = "<|im_end|>"

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "You may call these tools:\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    'Call one as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call><|im_end|>\n'
    "{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for call in message.tool_calls %}<tool_call>"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments }}}'
    "</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{%- for part in message.content %}"
    "{%- if part.text is defined %}{{ part.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_SUBJECTS = ["the narwhal", "a router", "the engine", "every request", "the scheduler", "a token"]
_VERBS = ["reads", "sends", "counts", "waits for", "serves", "refuses", "streams", "measures"]
_OBJECTS = [
    "the prompt",
    "a stream of events",
    "the budget",
    "its first token",
    "the queue",
    "a tool call",
    "the weather in Paris",
    "one hundred numbers",
]
_EXTRA = (
    "Once upon a time there was a small whale with a long tooth. Hello there, how are you? "
    'Call get_weather with {"city": "Paris", "unit": "celsius"} and answer in JSON. '
    "0 1 2 3 4 5 6 7 8 9 10 42 100 2048 3.14 - + = ( ) [ ] { } : ; , . ! ? ' \" / \\ _ * # @ "
    "The quick brown fox jumps over the lazy dog. Write a poem about the sea. "
)


def corpus() -> list[str]:
    """The fixed training text: every subject-verb-object sentence, and a few extras."""
    lines = [f"{s} {v} {o}." for s in _SUBJECTS for v in _VERBS for o in _OBJECTS]  # 384 sentences
    return [*lines, _EXTRA, _EXTRA.upper()]


def digest() -> str:
    """The cache key: this file's content (the build is a function of it alone)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("NARWHAL_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "narwhal", "models"
    )
    return Path(base)


def model_dir() -> Path:
    return cache_root() / digest()


def is_built(path: Path) -> bool:
    return all((path / name).is_file() for name in FILES)


def ensure_built(python: str, timeout: float = 300.0) -> Path:
    """The model's directory, built first (with `python`, the engines' interpreter) when the
    cache has no complete copy. Concurrent callers each build into a temporary directory and
    rename it into place, so nobody ever sees half a model."""
    path = model_dir()
    if is_built(path):
        return path
    subprocess.run(
        [python, __file__, str(path)], check=True, timeout=timeout, stdout=subprocess.DEVNULL
    )
    if not is_built(path):
        raise RuntimeError(f"building the test model left {path} incomplete")
    return path


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def _weights(vocab: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(SEED)

    def normal(*shape: int, std: float = 0.2) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, HIDDEN, std=1.0)}
    width = HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(width, HIDDEN)
        tensors[p + "self_attn.k_proj.weight"] = normal(width, HIDDEN)
        tensors[p + "self_attn.v_proj.weight"] = normal(width, HIDDEN)
        tensors[p + "self_attn.o_proj.weight"] = normal(HIDDEN, width)
        tensors[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
        tensors[p + "input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    tensors["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    # Large output weights: sharp, varied next-token choices rather than one repeated token.
    tensors["lm_head.weight"] = normal(vocab, HIDDEN, std=1.0)
    return tensors


def build(target: Path) -> None:
    from safetensors.numpy import save_file

    tokenizer = _tokenizer()
    vocab = tokenizer.get_vocab_size()
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids["<|endoftext|>"],
        "torch_dtype": "float32",
    }
    generation = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids[EOS]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITIONS,
        "eos_token": EOS,
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    special_map = {"eos_token": EOS, "pad_token": "<|endoftext|>"}
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tokenizer.save(str(work / "tokenizer.json"))
        save_file(_weights(vocab), str(work / "model.safetensors"), metadata={"format": "pt"})
        for name, data in (
            ("config.json", config),
            ("generation_config.json", generation),
            ("tokenizer_config.json", tokenizer_config),
            ("special_tokens_map.json", special_map),
        ):
            (work / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        try:
            work.rename(target)
        except OSError:
            if not is_built(target):  # someone else's build won the race only if complete
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else model_dir()
    if not is_built(out):
        build(out)
    print(out)
