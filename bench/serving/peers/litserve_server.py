"""LitServe for bench/serving_peers.py: a LitAPI with batching (max_batch_size,
batch_timeout), `workers` inference workers on the CPU, at POST /predict with {"data": [row]}
-> {"output": [row]}. Run it with the peer-litserve venv's Python."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _peer_args  # noqa: E402

ARGS = _peer_args.parse(__doc__.split("\n\n")[0])
os.environ["OMP_NUM_THREADS"] = "1"

import litserve as ls  # noqa: E402


class TorchScriptAPI(ls.LitAPI):
    def setup(self, device):
        _peer_args.one_thread()
        self.module = _peer_args.load(ARGS.model_file)

    def decode_request(self, request):
        return request["data"]

    def batch(self, inputs):
        return inputs

    def predict(self, rows):
        if rows and not isinstance(rows[0], list):  # unbatched: one row
            return _peer_args.run_rows(self.module, [rows], ARGS.dtype)[0]
        return _peer_args.run_rows(self.module, rows, ARGS.dtype)

    def unbatch(self, output):
        return output

    def encode_response(self, output):
        return {"output": output}


if __name__ == "__main__":
    api = TorchScriptAPI(max_batch_size=ARGS.max_batch_size,
                         batch_timeout=ARGS.batch_delay_ms / 1000.0, api_path="/predict")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=ARGS.workers, timeout=60)
    server.run(host="127.0.0.1", port=ARGS.port, log_level="warning",
               generate_client_file=False)
