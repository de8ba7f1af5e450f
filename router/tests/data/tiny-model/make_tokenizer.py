"""Writes tokenizer.json: a tiny byte-level BPE (SmolLM2-style specials) for the router's tests.

Run with any Python that has `tokenizers`: `python make_tokenizer.py`.
"""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TEXT = [
    "The capital of France is Paris. The capital of Germany is Berlin.",
    "Hello world! How are you today? I am fine, thank you.",
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "Stop strings end the answer. STOP here. The end.",
    "Unicode: café, naïve, 日本語のテキスト, emoji 🎉🚀, Ελληνικά, русский.",
    "def main():\n    print('hi')\n    return 0\n",
]

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator(TEXT * 4, trainer)
tok.save("tokenizer.json")
print(tok.get_vocab_size())
