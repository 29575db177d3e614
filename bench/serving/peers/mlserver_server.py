"""MLServer 1.7.1 for bench/serving_peers.py: settings.json (parallel inference workers,
adaptive batching, no metrics server in the way of the port) and the model's
model-settings.json pointing at mlserver_runtime.TorchScriptModel, then `mlserver start`.
Run it with the peer-mlserver venv's Python."""

import json
import os
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _peer_args  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = _peer_args.parse(__doc__.split("\n\n")[0])
    work = Path(args.work_dir)
    model_dir = work / "models" / args.model
    model_dir.mkdir(parents=True, exist_ok=True)
    (work / "models" / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": args.port, "grpc_port": free_port(),
        "metrics_port": free_port(), "parallel_workers": args.workers, "debug": False,
        "load_models_at_startup": True}))
    settings = {"name": args.model, "implementation": "mlserver_runtime.TorchScriptModel",
                "parameters": {"uri": str(Path(args.model_file).resolve())}}
    if args.max_batch_size > 1:
        settings["max_batch_size"] = args.max_batch_size
        settings["max_batch_time"] = args.batch_delay_ms / 1000.0
    (model_dir / "model-settings.json").write_text(json.dumps(settings))
    venv_bin = Path(sys.executable).parent
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=f"{HERE}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))
    os.execve(str(venv_bin / "mlserver"), [str(venv_bin / "mlserver"), "start",
                                           str(work / "models")], env)


if __name__ == "__main__":
    main()
