"""A Hugging Face Trainer job as users write it: text augmented and tokenized in ``__getitem__``, the
Trainer's default of 0 DataLoader workers, a tiny BERT built from a config (nothing downloaded).

Needs transformers and accelerate; used by tests that skip without them.
"""

import argparse
import os
import random
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast, Trainer, TrainingArguments

WORDS = [f"w{k}" for k in range(400)]


def make_tokenizer(folder: str) -> BertTokenizerFast:
    vocab = os.path.join(folder, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return BertTokenizerFast(vocab_file=vocab)


class AugmentedText(Dataset):
    """Each sample: a sentence, augmented (word dropout and swaps, repeated), then tokenized."""

    def __init__(self, tokenizer: BertTokenizerFast, n: int = 4000) -> None:
        self.tokenizer = tokenizer
        rng = random.Random(0)
        self.texts = [" ".join(rng.choice(WORDS) for _ in range(120)) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> dict:
        rng = random.Random(index)
        words = self.texts[index].split()
        for _ in range(60):  # the augmentation: pure Python, per sample
            words = [w for w in words if rng.random() > 0.02] or words
            i, j = rng.randrange(len(words)), rng.randrange(len(words))
            words[i], words[j] = words[j], words[i]
        encoded = self.tokenizer(" ".join(words), truncation=True, max_length=64, padding="max_length")
        return {"input_ids": torch.tensor(encoded["input_ids"]),
                "attention_mask": torch.tensor(encoded["attention_mask"]), "labels": torch.tensor(index % 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, help="torch's compute threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = make_tokenizer(folder)
        config = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64)
        model = BertForSequenceClassification(config)
        training_args = TrainingArguments(output_dir=os.path.join(folder, "out"), max_steps=args.steps,
                                          per_device_train_batch_size=16, report_to="none", save_strategy="no",
                                          logging_strategy="no", use_cpu=True, disable_tqdm=True)
        trainer = Trainer(model=model, args=training_args, train_dataset=AugmentedText(tokenizer))
        trainer.train()


if __name__ == "__main__":
    main()
