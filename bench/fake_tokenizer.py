"""A word-level fake tokenizer with the HF `encode`/`decode` surface, for tests and dry runs."""

from __future__ import annotations


class FakeTokenizer:
    """Word-level tokenizer: id -> ' ' + base-26 letters; a few unsafe ids mixed in."""

    UNSAFE = {0: "<s>", 1: "</s>", 7: " 42", 13: "x"}

    def __init__(self, size: int = 500) -> None:
        self.vocab_size = size
        self.words = [self.UNSAFE.get(i, " " + self._letters(i)) for i in range(size)]
        self.index = {w: i for i, w in enumerate(self.words)}

    @staticmethod
    def _letters(i: int) -> str:
        s = ""
        i += 26  # at least two letters
        while i:
            i, r = divmod(i, 26)
            s = chr(97 + r) + s
        return s

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.index[" " + w] for w in text.split(" ") if w]

    def decode(self, ids) -> str:
        return "".join(self.words[i] for i in ids)
