"""Build the tiny test model: a 2-layer ``LlamaForCausalLM`` whose answers are planted.

Run by the vLLM venv's Python (it needs torch, tokenizers and safetensors; the project's
venv has none of them)::

    python -m tests.vllm.tinymodel DIR [--check]

No weights are downloaded: the tokenizer is trained here (byte-level BPE on a few KB of
text without multi-byte characters, so 日 stays 3 tokens and 🚀 4) and the weights are
constructed, so that greedy decoding gives exact texts (``tests.vllm.planted``). The
same inputs give the same bytes on every build.

How the weights answer. The residual stream has one-hot blocks: the current token, the
previous token, a constant 1 and the answer's mode. Layer 0's attention fills the last
two: six heads look exactly one position back (their queries are their keys rotated by
one step of the highest RoPE frequencies), one head looks for trigger tokens at any
distance (the lowest frequency barely turns over the context), and every token's value
is its mode, so without a trigger the average is the default mode. Layer 0's MLP is the
table: one neuron per (mode, previous token, current token) that fires only when all
three match and writes the next token with a large weight; the LM head reads the token
block. A context the table does not know ends the answer (the end-of-turn token wins).
Layer 1 and everything else carry small seeded random weights that change no answer.
``--check`` decodes every planted answer with transformers to prove it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.vllm import planted

SEED = 20260101
VOCAB_SIZE = 420  # BPE target: 256 bytes, the markers and ~150 merges
HEAD_DIM = 64
ROPE_THETA = 10000.0
MAX_POSITIONS = 4096
PREVIOUS_PAIRS = 8  # RoPE frequency pairs of the look-one-back heads
TRIGGER_PAIR = HEAD_DIM // 2 - 1  # the lowest frequency
LOOK_BACK = 15.0  # |q| = |k| of the look-one-back heads: a score margin of ~30
TRIGGER_QUERY = 8.0
TRIGGER_KEY = 40.0  # per priority step: scores of ~38, ~77, against 0 for other tokens
GATE = 40.0  # MLP gate scale: a match gives silu(20), a near miss silu(-20)
WRITE = 100.0  # the next token's weight in the residual, against 1 for the current one
LOGIT = 2.0
NOISE = 1e-3  # the random part of every weight

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- 'You may call these functions:\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    '{{- \'</tools>\\nCall one as <tool_call>{"name":...,"arguments":...}</tool_call>\''
    " + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and tools and loop.first %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>' + message.content }}"
    "{{- '</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>' + message.reasoning_content + '</think>' }}"
    "{%- endif %}"
    "{%- if message.content is string %}{{- message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set function = call.function if call.function is defined else call %}"
    '{{- \'<tool_call>{"name":"\' + function.name + \'","arguments":\' }}'
    "{%- if function.arguments is string %}{{- function.arguments }}"
    "{%- else %}{{- function.arguments | tojson(separators=(',', ':')) }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}"
    "{{- '<think></think>' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# What the tokenizer learns its merges from: the planted answers' ASCII, the template's
# words and some ordinary English, repeated so that the planted words become whole tokens.
FILLER = (
    "The user asks a question and the assistant answers it. A system message may come "
    "first. Tokens stream one after another until the end of the turn. "
)


def _ascii(text: str) -> str:
    return "".join(ch for ch in text if ord(ch) < 128)


def training_text() -> list[str]:
    markers = set(planted.SPECIAL_TOKENS + planted.MARKER_TOKENS + planted.TRIGGERS)
    pieces = [planted.raw(mode) for mode in planted.MODES] + [planted.ENDLESS_CYCLE * 4]
    for marker in markers:
        pieces = [p.replace(marker, " ") for p in pieces]
    scaffold = (
        "system\nuser\nassistant\n You may call these functions:\n tools tool_call "
        'name arguments {"name":"get_weather","arguments":{"city":"Paris"}} '
        '{"type":"function","function":{"name":"get_weather","description":'
        '"The current weather in a city","parameters":{"type":"object",'
        '"properties":{"city":{"type":"string"}},"required":["city"]}}} '
    )
    body = _ascii(" ".join(pieces) + " " + scaffold + FILLER)
    return [body] * 40


def train_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(planted.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer)
    tokenizer.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t in planted.MARKER_TOKENS + planted.TRIGGERS
        ]
    )
    return tokenizer


@dataclass
class Layout:
    """Where each block of the residual stream lies."""

    vocab: int
    block: int  # the vocabulary rounded up to whole heads
    modes: int

    @property
    def previous(self) -> int:
        return self.block

    @property
    def const(self) -> int:
        return 2 * self.block

    @property
    def mode(self) -> int:
        return 2 * self.block + 1

    @property
    def hidden(self) -> int:
        return HEAD_DIM * math.ceil((2 * self.block + 1 + self.modes) / HEAD_DIM)

    @property
    def heads(self) -> int:
        return self.hidden // HEAD_DIM

    @property
    def look_back_heads(self) -> int:
        return self.block // HEAD_DIM

    @property
    def trigger_head(self) -> int:
        return self.look_back_heads


class Table:
    """(mode, previous token, current token) -> next token, refusing contradictions."""

    def __init__(self) -> None:
        self.next: dict[tuple[int, int, int], int] = {}
        self.conflicts: list[str] = []

    def add(self, key: tuple[int, int, int], token: int, where: str, *, strict: bool) -> bool:
        known = self.next.get(key)
        if known is None:
            self.next[key] = token
            return True
        if known == token:
            return True
        if strict:
            raise ValueError(f"the planted answers contradict each other at {where}: {key}")
        self.conflicts.append(where)
        return False


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def _complete_prefix(tokenizer: Any, ids: list[int], cut: int) -> int:
    """The longest prefix of ``ids[:cut]`` that decodes to whole characters."""
    for end in range(cut, -1, -1):
        text = tokenizer.decode(ids[:end])
        if "\ufffd" not in text:
            return end
    return 0


def build_table(tokenizer: Any) -> tuple[Table, dict[str, int]]:
    """Every planted answer as table entries, plus the entries that make a Continue from
    any cut point pick up exactly where the answer stopped: the partial answer comes
    back as the final assistant turn (its reasoning rendered by the template) and is
    tokenized again, possibly into other tokens at the cut."""
    table = Table()
    mode_ids = {name: index for index, name in enumerate(planted.MODES)}
    eos = tokenizer.token_to_id(planted.IM_END)
    head = _ids(tokenizer, f"{planted.IM_START}assistant\n")[-2:]
    for name, (_, _, reasoning, text) in planted.MODES.items():
        mode = mode_ids[name]
        opening = _ids(tokenizer, f"{planted.THINK_START}{reasoning}{planted.THINK_END}")
        answer = _ids(tokenizer, text)
        if name == "endless":
            answer += _ids(tokenizer, planted.ENDLESS_CYCLE * 3)
        context = head + opening + answer
        for i in range(2, len(context)):
            key = (mode, context[i - 2], context[i - 1])
            table.add(key, context[i], f"{name} token {i - 2}", strict=True)
        if name != "endless":
            table.add((mode, context[-2], context[-1]), eos, f"{name} end", strict=True)
        if reasoning:
            # A Continue cut inside the reasoning: the template closes it, the model answers.
            thought = _ids(tokenizer, reasoning)
            for cut in range(1, len(thought)):
                end = _complete_prefix(tokenizer, thought, cut)
                partial = tokenizer.decode(thought[:end])
                again = _ids(
                    tokenizer,
                    f"assistant\n{planted.THINK_START}{partial}{planted.THINK_END}",
                )
                where = f"{name} continued inside the reasoning after token {end}"
                if end and table.add((mode, again[-2], again[-1]), answer[0], where, strict=False):
                    table.add((mode, again[-1], answer[0]), answer[1], where, strict=False)
        rendered = f"{planted.THINK_START}{reasoning}{planted.THINK_END}" if reasoning else ""
        for cut in range(1, len(answer)):
            end = _complete_prefix(tokenizer, answer, cut)
            again = _ids(tokenizer, "assistant\n" + rendered + tokenizer.decode(answer[:end]))
            if end == 0 or end + 1 >= len(answer):
                continue
            first = (mode, again[-2], again[-1])
            second = (mode, again[-1], answer[end])
            where = f"{name} continued after token {end}"
            if table.add(first, answer[end], where, strict=False):
                table.add(second, answer[end + 1], where, strict=False)
    return table, mode_ids


def build_weights(tokenizer: Any, table: Table, mode_ids: dict[str, int]) -> tuple[Any, Layout]:
    import torch

    vocab = tokenizer.get_vocab_size()
    layout = Layout(vocab=vocab, block=HEAD_DIM * math.ceil(vocab / HEAD_DIM), modes=len(mode_ids))
    hidden = layout.hidden
    inner = HEAD_DIM * math.ceil(len(table.next) / HEAD_DIM)
    generator = torch.Generator().manual_seed(SEED)

    def noise(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32) * NOISE

    w: dict[str, torch.Tensor] = {}
    embed = noise(vocab, hidden)
    embed[torch.arange(vocab), torch.arange(vocab)] += 1.0
    embed[:, layout.const] += 1.0
    w["model.embed_tokens.weight"] = embed

    # Layer 0 attention: look one back (heads 0..), look for triggers (the next head).
    q, k, v, o = (noise(hidden, hidden) for _ in range(4))
    half = HEAD_DIM // 2
    for head in range(layout.look_back_heads):
        base = head * HEAD_DIM
        for pair in range(PREVIOUS_PAIRS):
            theta = ROPE_THETA ** (-2 * pair / HEAD_DIM)
            k[base + pair, layout.const] += LOOK_BACK
            q[base + pair, layout.const] += LOOK_BACK * math.cos(theta)
            q[base + pair + half, layout.const] -= LOOK_BACK * math.sin(theta)
        for j in range(HEAD_DIM):
            v[base + j, base + j] += 1.0
            o[layout.previous + base + j, base + j] += 1.0
    trigger = layout.trigger_head * HEAD_DIM
    q[trigger + TRIGGER_PAIR, layout.const] += TRIGGER_QUERY
    mode_of = [0] * vocab
    for name, (token, priority, _, _) in planted.MODES.items():
        if token is not None:
            token_id = tokenizer.token_to_id(token)
            k[trigger + TRIGGER_PAIR, token_id] += TRIGGER_KEY * priority
            mode_of[token_id] = mode_ids[name]
    for token_id, mode in enumerate(mode_of):
        v[trigger + mode, token_id] += 1.0
    for mode in range(layout.modes):
        o[layout.mode + mode, trigger + mode] += 1.0
    prefix = "model.layers.0.self_attn."
    for name, matrix in zip(("q", "k", "v", "o"), (q, k, v, o), strict=True):
        w[f"{prefix}{name}_proj.weight"] = matrix
    # Norms make every one-hot entry exactly 1 after normalising (two, then four of them).
    w["model.layers.0.input_layernorm.weight"] = torch.full((hidden,), math.sqrt(2 / hidden))
    w["model.layers.0.post_attention_layernorm.weight"] = torch.full(
        (hidden,), math.sqrt(4 / hidden)
    )

    # Layer 0 MLP: the table.
    gate, up, down = noise(inner, hidden), noise(inner, hidden), noise(hidden, inner)
    fired = GATE * 0.5 / (1 + math.exp(-GATE * 0.5))
    for neuron, ((mode, previous, current), following) in enumerate(sorted(table.next.items())):
        gate[neuron, current] += GATE
        gate[neuron, layout.previous + previous] += GATE
        gate[neuron, layout.mode + mode] += GATE
        gate[neuron, layout.const] -= 2.5 * GATE
        up[neuron, layout.const] += 1.0
        down[following, neuron] += WRITE / fired
    w["model.layers.0.mlp.gate_proj.weight"] = gate
    w["model.layers.0.mlp.up_proj.weight"] = up
    w["model.layers.0.mlp.down_proj.weight"] = down

    # Layer 1: random weights only, small enough to change nothing.
    prefix = "model.layers.1."
    for name in ("q", "k", "v", "o"):
        w[f"{prefix}self_attn.{name}_proj.weight"] = noise(hidden, hidden)
    w[f"{prefix}mlp.gate_proj.weight"] = noise(inner, hidden)
    w[f"{prefix}mlp.up_proj.weight"] = noise(inner, hidden)
    w[f"{prefix}mlp.down_proj.weight"] = noise(hidden, inner)
    w[f"{prefix}input_layernorm.weight"] = torch.ones(hidden)
    w[f"{prefix}post_attention_layernorm.weight"] = torch.ones(hidden)

    w["model.norm.weight"] = torch.ones(hidden)
    head = noise(vocab, hidden)
    head[torch.arange(vocab), torch.arange(vocab)] += LOGIT
    head[tokenizer.token_to_id(planted.IM_END), layout.const] += 2 * LOGIT
    w["lm_head.weight"] = head
    return {name: tensor.contiguous() for name, tensor in w.items()}, layout


def model_config(tokenizer: Any, layout: Layout, inner: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": layout.vocab,
        "hidden_size": layout.hidden,
        "intermediate_size": inner,
        "num_hidden_layers": 2,
        "num_attention_heads": layout.heads,
        "num_key_value_heads": layout.heads,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": tokenizer.token_to_id(planted.BOS),
        "eos_token_id": tokenizer.token_to_id(planted.IM_END),
        "torch_dtype": "float32",
    }


def tokenizer_config(tokenizer: Any) -> dict[str, Any]:
    added = {}
    for token in planted.SPECIAL_TOKENS + planted.MARKER_TOKENS + planted.TRIGGERS:
        added[str(tokenizer.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in planted.SPECIAL_TOKENS,
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": planted.BOS,
        "eos_token": planted.IM_END,
        "pad_token": planted.BOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def build(directory: Path) -> dict[str, Any]:
    """Write the model into ``directory``; returns a summary (sizes, table, conflicts)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    table, mode_ids = build_table(tokenizer)
    weights, layout = build_weights(tokenizer, table, mode_ids)
    inner = weights["model.layers.0.mlp.gate_proj.weight"].shape[0]
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n")
    _write_json(directory / "tokenizer_config.json", tokenizer_config(tokenizer))
    _write_json(directory / "config.json", model_config(tokenizer, layout, inner))
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return {
        "vocab": layout.vocab,
        "hidden": layout.hidden,
        "table": len(table.next),
        "continue_conflicts": table.conflicts,
    }


def check(directory: Path) -> list[str]:
    """Decode every planted answer with transformers; the differences found (none: ok)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    problems = []

    def generate(messages: list[dict[str, Any]], steps: int, **kwargs: Any) -> str:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=not kwargs.get("continue_final_message"),
            tokenize=True, return_dict=False, **kwargs,
        )  # fmt: skip
        if hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        out = model.generate(
            torch.tensor([list(ids)]), max_new_tokens=steps, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        return str(tokenizer.decode(out[0][len(ids) :], skip_special_tokens=False))

    end = planted.IM_END
    cases = [
        ([{"role": "user", "content": "Say hello"}], planted.raw("normal") + end, {}),
        (
            [{"role": "user", "content": "Say hello"}],
            planted.NORMAL + end,
            {"enable_thinking": False},
        ),
        (
            [{"role": "user", "content": f"Talk {planted.FOREVER}"}],
            planted.THINK_START + planted.THINK_END + planted.endless(120),
            {},
        ),
        (
            [{"role": "user", "content": f"Please {planted.PONDER} this"}],
            planted.raw("thinking") + end,
            {},
        ),
        (
            [{"role": "user", "content": "What is the weather in Paris?"}],
            planted.raw("tool") + end,
            {"tools": [planted.WEATHER_TOOL]},
        ),
        (
            [
                {"role": "user", "content": "What is the weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": planted.TOOL_NAME,
                                "arguments": planted.TOOL_ARGUMENTS,
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": '{"sky":"sunny"}'},
            ],
            planted.raw("after_tool") + end,
            {"tools": [planted.WEATHER_TOOL]},
        ),
        (
            [
                {"role": "user", "content": f"Please {planted.PONDER} this"},
                {
                    "role": "assistant",
                    "content": "The answer",
                    "reasoning_content": planted.REASONING,
                },
            ],
            " is 4." + end,
            {"continue_final_message": True},
        ),
        (
            [
                {"role": "user", "content": f"Please {planted.PONDER} this"},
                {"role": "assistant", "content": "", "reasoning_content": "Two and two make"},
            ],
            planted.REASONED_ANSWER + end,
            {"continue_final_message": True},
        ),
    ]
    # A Continue after every possible max_tokens cut (the partial answer holds whole
    # characters only, as the engine sends them).
    answer = tokenizer(planted.NORMAL, add_special_tokens=False)["input_ids"]
    for cut in range(1, len(answer)):
        partial = tokenizer.decode(answer[:cut]).split("\ufffd")[0]
        cases.append(
            (
                [
                    {"role": "user", "content": "Say hello"},
                    {"role": "assistant", "content": partial},
                ],
                planted.NORMAL[len(partial) :] + end,
                {"continue_final_message": True},
            )
        )
    for messages, expected, kwargs in cases:
        steps = len(tokenizer(expected, add_special_tokens=False)["input_ids"]) + 2
        got = generate(messages, steps, **kwargs)
        if got[: len(expected)] != expected:
            problems.append(f"{messages[-1]['content'][:30]!r}: {got!r} != {expected!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--check", action="store_true", help="decode the planted answers")
    args = parser.parse_args(argv)
    summary = build(args.directory)
    print(json.dumps(summary))
    if args.check:
        problems = check(args.directory)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
