"""Build a random-weight GPT-2 model and its tokenizer (run by the SGLang venv's python).

Standalone on purpose: it runs in the SGLang venv, where thunder_sgl is not installed, and
needs only torch, transformers and tokenizers. Called by ``thunder_sgl.engine.models``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Append-only ChatML: each message is "<|im_start|>role\ncontent<|im_end|>\n", so the prompt of
# turn k+1 starts with the exact text of turn k's prompt plus its answer.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--positions", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    a = ap.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(a.corpus)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", model_max_length=a.positions)
    fast.chat_template = CHAT_TEMPLATE
    a.out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(a.out)

    torch.manual_seed(a.seed)
    cfg = GPT2Config(vocab_size=len(fast), n_positions=a.positions, n_embd=a.width, n_layer=a.layers,
                     n_head=a.heads, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                     pad_token_id=fast.pad_token_id)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(a.out, safe_serialization=True)


if __name__ == "__main__":
    main()
