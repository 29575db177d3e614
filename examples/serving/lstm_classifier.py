#!/usr/bin/python3
"""The serving benchmark's workload (issue 6): a small LSTM text classifier, and two smaller
models next to it, exported as TorchScript for `shoal serve` and the FastAPI baseline.

    /usr/bin/python3 examples/serving/lstm_classifier.py --out /tmp/models/lstm/1/model.pt
    /usr/bin/python3 examples/serving/lstm_classifier.py --model mlp --out /tmp/models/mlp/1/model.pt
    /usr/bin/python3 examples/serving/lstm_classifier.py --repository /tmp/models   # all three

| model    | input                        | output                   |
|----------|------------------------------|--------------------------|
| lstm     | tokens INT64 [batch, 32]     | logits FP32 [batch, 10]  |
| identity | x FP32 [batch, 16]           | the same tensor          |
| mlp      | x FP32 [batch, 64]           | scores FP32 [batch, 10]  |

The LSTM is like the published Python serving stack's workload the issue measures against: an
embedding of a 50,000-word vocabulary (64 dimensions), one LSTM layer (64 hidden units) over
sequences of 32 token ids, and a linear layer from the last hidden state to 10 class logits.
Weights are random from a fixed seed: every export has the same weights.

Each model returns one tensor (served as output__0 unless a config.yaml names it:
bench/serving_bench.py writes one with the names above). Run it with Debian's python3
(python3-torch): the files are read by the same version of libtorch.
"""

import argparse
import sys
from pathlib import Path

import torch

VOCAB_SIZE = 50_000
SEQUENCE_LENGTH = 32
NUM_CLASSES = 10
EMBEDDING_DIM = 64
HIDDEN_SIZE = 64
IDENTITY_FEATURES = 16
MLP_FEATURES = 64
MLP_HIDDEN = 128
SEED = 0


class LstmClassifier(torch.nn.Module):
    """tokens [batch, seq] INT64 -> logits [batch, classes] FP32."""

    def __init__(self, vocab_size: int = VOCAB_SIZE, embedding_dim: int = EMBEDDING_DIM,
                 hidden_size: int = HIDDEN_SIZE, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, embedding_dim)
        self.lstm = torch.nn.LSTM(embedding_dim, hidden_size, num_layers=1, batch_first=True)
        self.classifier = torch.nn.Linear(hidden_size, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.embedding(tokens)
        _, (hidden, _) = self.lstm(embedded)
        return self.classifier(hidden[-1])


class Identity(torch.nn.Module):
    """x -> x."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Mlp(torch.nn.Module):
    """x [batch, 64] FP32 -> scores [batch, 10] FP32."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(MLP_FEATURES, MLP_HIDDEN)
        self.out = torch.nn.Linear(MLP_HIDDEN, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def _save(module: torch.nn.Module, out) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scripted = torch.jit.script(module.eval())
    scripted.save(str(out))
    return out


def export_lstm(out) -> Path:
    """Writes the LSTM classifier (input `tokens`, output `logits`) to out (.../model.pt)."""
    torch.manual_seed(SEED)
    return _save(LstmClassifier(), out)


def export_identity(out) -> Path:
    """Writes the identity model (input `x` FP32 [batch, 16], output the same)."""
    return _save(Identity(), out)


def export_mlp(out) -> Path:
    """Writes the MLP (input `x` FP32 [batch, 64], output `scores` FP32 [batch, 10])."""
    torch.manual_seed(SEED)
    return _save(Mlp(), out)


EXPORTERS = {"lstm": export_lstm, "identity": export_identity, "mlp": export_mlp}

# Per model: (input name, datatype, dims without the batch dimension), (output name, datatype,
# dims without the batch dimension). What bench/serving_bench.py declares in config.yaml and
# sends in its requests.
SIGNATURES = {
    "lstm": (("tokens", "INT64", [SEQUENCE_LENGTH]), ("logits", "FP32", [NUM_CLASSES])),
    "identity": (("x", "FP32", [IDENTITY_FEATURES]), ("output", "FP32", [IDENTITY_FEATURES])),
    "mlp": (("x", "FP32", [MLP_FEATURES]), ("scores", "FP32", [NUM_CLASSES])),
}


def export_repository(directory) -> dict:
    """Writes all three as DIR/<model>/1/model.pt; returns {model: path}."""
    return {name: fn(Path(directory) / name / "1" / "model.pt") for name, fn in EXPORTERS.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="where to write the model, e.g. DIR/lstm/1/model.pt")
    parser.add_argument("--model", choices=sorted(EXPORTERS), default="lstm",
                        help="which model --out gets (default lstm)")
    parser.add_argument("--repository", help="write all three models as DIR/<model>/1/model.pt")
    args = parser.parse_args(argv)
    if not args.out and not args.repository:
        parser.error("give --out FILE or --repository DIR")
    torch.set_num_threads(1)
    if args.out:
        print(EXPORTERS[args.model](args.out))
    if args.repository:
        for path in export_repository(args.repository).values():
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
