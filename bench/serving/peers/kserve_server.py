"""KServe 0.21's Python model server for bench/serving_peers.py: a kserve.Model serving the
TorchScript model on the v2 API, with `workers` REST processes. KServe starts its workers by
pickling the registered models into spawned processes, and a TorchScript module cannot be
pickled: the model drops its module when pickled and loads it again in each worker. KServe's
Python server has no batcher of its own (batching is a separate agent in a Kubernetes
deployment). Run it with the peer-kserve venv's Python."""

import json
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _peer_args  # noqa: E402

if __name__ == "__main__":  # not in the spawned workers, which get sys.argv as set here
    ARGS = _peer_args.parse(__doc__.split("\n\n")[0])
    os.environ["OMP_NUM_THREADS"] = "1"
    # No log lines per request (kserve.trace's wall and CPU times, uvicorn's access log), as
    # the FastAPI app has none. Each worker configures its logging from this file.
    log_config = Path(ARGS.work_dir) / "logging.json"
    log_config.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(process)s %(name)s %(levelname)s "
                                           "%(message)s"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain",
                                "stream": "ext://sys.stderr"}},
        "loggers": {name: {"handlers": ["stderr"], "level": level, "propagate": False}
                    for name, level in (("kserve", "INFO"), ("kserve.trace", "WARNING"),
                                        ("uvicorn", "INFO"), ("uvicorn.access", "WARNING"))}}))
    # kserve parses sys.argv when imported (here and in each spawned worker, which gets
    # sys.argv as set here): none of ours, only its own logging configuration.
    sys.argv = [sys.argv[0], "--log_config_file", str(log_config)]

import torch  # noqa: E402
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer  # noqa: E402


class TorchScriptModel(Model):
    def __init__(self, name, path):
        super().__init__(name)
        self.path = path
        self.module = None
        self.load()

    def load(self):
        _peer_args.one_thread()
        self.module = _peer_args.load(self.path)
        self.ready = True
        return True

    def __getstate__(self):
        state = self.__dict__.copy()
        state["module"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.load()

    def predict(self, payload: InferRequest, headers=None, response_headers=None):
        x = payload.inputs[0].as_numpy()
        with torch.inference_mode():
            y = self.module(torch.from_numpy(x)).numpy()
        out = InferOutput(name="output", shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[out], 
                             response_id=payload.id or str(uuid.uuid4()))


def patient_liveness_check():
    """KServe's parent pings each worker every 0.5 s and kills one that has not answered
    within 5 s, and a worker answers only once it has imported torch and kserve and loaded its
    model: on a loaded 2-core machine that takes longer, and the workers are killed and
    restarted for ever. The check waits 60 s instead; nothing on the request path changes."""
    from kserve.protocol.rest.multiprocess import server as multiprocess_server
    is_alive = multiprocess_server.RESTServerProcess.is_alive
    multiprocess_server.RESTServerProcess.is_alive = (
        lambda self, timeout=5: is_alive(self, timeout=max(timeout, 60)))


if __name__ == "__main__":
    patient_liveness_check()
    ModelServer(http_port=ARGS.port, workers=ARGS.workers, enable_grpc=False,
                enable_latency_logging=False).start([TorchScriptModel(ARGS.model,
                                                                      ARGS.model_file)])
