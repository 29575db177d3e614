"""TorchServe handler of bench/serving_peers.py: TorchServe's native API (POST /predictions/M
with {"data": [row]} -> {"output": [row]}), every request of a batch read and answered (the
built-in v2 envelope reads only the first request of a batch)."""

import json
import os

import torch


class TorchScriptHandler:
    def __init__(self):
        self.module = None
        self.dtype = None

    def initialize(self, context):
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        model_dir = context.system_properties["model_dir"]
        serialized = context.manifest["model"]["serializedFile"]
        self.module = torch.jit.load(os.path.join(model_dir, serialized), map_location="cpu")
        self.module.eval()
        with open(os.path.join(model_dir, "signature.json")) as f:
            self.dtype = {"FP32": torch.float32, "INT64": torch.int64}[json.load(f)["dtype"]]

    def handle(self, data, context):
        rows = []
        for request in data:
            body = request.get("data")
            if body is None:
                body = request.get("body")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            rows.append(body["data"] if isinstance(body, dict) else body)
        with torch.inference_mode():
            out = self.module(torch.tensor(rows, dtype=self.dtype))
        return [{"output": r} for r in out.reshape(out.shape[0], -1).tolist()]


_service = TorchScriptHandler()


def handle(data, context):
    if data is None:
        return None
    if _service.module is None:
        _service.initialize(context)
    return _service.handle(data, context)
