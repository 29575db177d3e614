#!/usr/bin/python3
"""The FastAPI baseline of bench/serving_bench.py: the common Python serving stack (FastAPI on
uvicorn, optionally gunicorn with uvicorn workers) around PyTorch, serving the TorchScript files
of a `shoal serve` model repository through the same KServe v2 JSON API subset.

    /usr/bin/python3 bench/serving/fastapi_baseline.py --model-repository DIR [--port 0]
        [--host 127.0.0.1] [--workers 1] [--server uvicorn|gunicorn] [--warmup-runs 3]

Once its port is bound and (with one uvicorn worker) its models are loaded and warmed up, it
prints `fastapi_baseline: listening on http://HOST:PORT` on stdout. /v2/health/ready is 200 from
then on (with gunicorn, once a worker has loaded the models).

Endpoints (docs/serving.md describes the same ones for shoal serve):
  GET  /v2/health/live, /v2/health/ready, /v2
  GET  /v2/models/{name}[/versions/{v}], .../ready
  POST /v2/models/{name}[/versions/{v}]/infer
       {"inputs": [{"name", "shape", "datatype", "data" (row-major, flat or nested)}],
        "outputs": [{"name"}] (optional)}
       -> {"model_name", "model_version", "id"?, "outputs": [{"name", "datatype", "shape",
           "data" (flat)}]}
  Errors are {"error": "..."}: 400 malformed JSON or request, wrong input name, datatype or
  shape; 404 unknown model, version or endpoint; 500 the model failed.

Configured at its best, as a careful deployment of this stack would be: one intra-op and one
inter-op torch thread per worker (workers are the unit of parallelism), torch.inference_mode,
every version loaded and warmed up before the port answers, uvloop and httptools, no access
log, long keep-alive, the JSON parsed and written with the standard library directly (no
pydantic models in the request path), and the handler `async` so that a request is run on the
event loop without a hop through a thread pool.

The repository: DIR/<model>/<version>/model.pt (versions are integers; requests without a
version get the newest), and an optional DIR/<model>/config.yaml, of which this reads `inputs`
and `outputs` ({name, datatype, dims}, for names and checks), `max_batch_size` (>= 1: the dims
leave out the batch dimension) and `warmup` ({count, inputs: {NAME: {dims, fill}}}); it does not
batch. Without `warmup`, declared inputs are warmed up at batch size 1 (`--warmup-runs` times);
without declared inputs the names come from forward's arguments and nothing is warmed up.
Needs Debian's python3-fastapi, python3-uvicorn, gunicorn, python3-uvloop, python3-httptools,
python3-yaml, python3-torch.
"""

import argparse
import json
import os
import re
import socket
import sys
from pathlib import Path

import torch

DATATYPES = {
    "BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16,
    "INT32": torch.int32, "INT64": torch.int64, "FP16": torch.float16, "FP32": torch.float32,
    "FP64": torch.float64,
}
DATATYPE_NAMES = {v: k for k, v in DATATYPES.items()}

_VERSION_RE = re.compile(r"^[1-9][0-9]*$")


class BadRequest(Exception):
    """A request the client got wrong: 400 (404 when status says so)."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


class ServedModel:
    """One version of one model: the TorchScript module and what the config declares."""

    def __init__(self, name, version, path, config):
        self.name, self.version = name, version
        self.module = torch.jit.load(str(path))
        self.module.eval()
        self.max_batch_size = int(config.get("max_batch_size", 0) or 0)
        declared = config.get("inputs")
        if declared:
            self.inputs = [(t["name"], t.get("datatype"), self._full_dims(t.get("dims")))
                           for t in declared]
        else:
            args = self.module.forward.schema.arguments[1:]
            self.inputs = [(a.name, None, None) for a in args]
        self.input_names = [i[0] for i in self.inputs]
        self.output_names = [t["name"] for t in (config.get("outputs") or [])]
        self.warmup = config.get("warmup")

    def _full_dims(self, dims):
        if dims is None:
            return None
        return ([-1] if self.max_batch_size >= 1 else []) + [int(d) for d in dims]

    def warm_up(self, runs):
        """Runs the config's warmup requests, or declared inputs at batch size 1, `runs` times."""
        batches = []
        if self.warmup:
            for entry in self.warmup:
                tensors = {}
                for name, spec in entry["inputs"].items():
                    dtype = DATATYPES[dict((i[0], i[1]) for i in self.inputs)[name]]
                    tensors[name] = _fill(spec.get("dims"), dtype, spec.get("fill", "zero"))
                batches += [tensors] * int(entry.get("count", 1))
        elif self.inputs and all(i[1] and i[2] is not None for i in self.inputs):
            tensors = {n: _fill([1 if d < 0 else d for d in dims], DATATYPES[dt], "zero")
                       for n, dt, dims in self.inputs}
            batches = [tensors] * runs
        with torch.inference_mode():
            for tensors in batches:
                self.module(*[tensors[n] for n in self.input_names])
        return len(batches)

    def infer(self, request):
        inputs = request.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise BadRequest("'inputs' is required: a non-empty list of "
                             "{name, shape, datatype, data}")
        given = {}
        for i, item in enumerate(inputs):
            name, tensor = _decode_tensor(i, item)
            if name not in self.input_names:
                raise BadRequest(f"model '{self.name}' has no input '{name}'; its inputs are: "
                                 + ", ".join(self.input_names))
            if name in given:
                raise BadRequest(f"input '{name}' is given twice")
            given[name] = tensor
        args = []
        for name, datatype, dims in self.inputs:
            if name not in given:
                raise BadRequest(f"missing input '{name}'; model '{self.name}' takes: "
                                 + ", ".join(self.input_names))
            t = given[name]
            if datatype and DATATYPE_NAMES[t.dtype] != datatype:
                raise BadRequest(f"input '{name}': datatype {DATATYPE_NAMES[t.dtype]}, model "
                                 f"'{self.name}' expects {datatype}")
            if dims is not None and (len(dims) != t.dim() or any(
                    d >= 0 and d != s for d, s in zip(dims, t.shape))):
                raise BadRequest(f"input '{name}': shape {list(t.shape)} does not match {dims} "
                                 "(-1: any size)")
            args.append(t)
        try:
            with torch.inference_mode():
                result = self.module(*args)
        except Exception as e:  # the model's own failure: 500
            raise BadRequest(f"model '{self.name}' version {self.version} failed: "
                             f"{type(e).__name__}: {_last_line(str(e))}",
                             500)
        if isinstance(result, torch.Tensor):
            named = [(self._output_name(0), result)]
        elif isinstance(result, (tuple, list)):
            named = [(self._output_name(i), t) for i, t in enumerate(result)]
        elif isinstance(result, dict):
            named = list(result.items())
        else:
            raise BadRequest(f"model '{self.name}' returned {type(result).__name__}, "
                             "not tensors", 500)
        wanted = request.get("outputs")
        if wanted:
            by_name = dict(named)
            try:
                names = [o["name"] for o in wanted]
            except (TypeError, KeyError):
                raise BadRequest("'outputs' must be a list of {name}")
            for n in names:
                if n not in by_name:
                    raise BadRequest(f"model '{self.name}' has no output '{n}'; its outputs "
                                     "are: " + ", ".join(by_name))
            named = [(n, by_name[n]) for n in names]
        answer = {"model_name": self.name, "model_version": self.version,
                  "outputs": [{"name": n, "datatype": DATATYPE_NAMES.get(t.dtype, str(t.dtype)),
                               "shape": list(t.shape), "data": t.reshape(-1).tolist()}
                              for n, t in named]}
        if "id" in request:
            answer["id"] = request["id"]
        return answer

    def _output_name(self, i):
        return self.output_names[i] if i < len(self.output_names) else f"output__{i}"

    def metadata(self, versions):
        return {"name": self.name, "versions": versions, "platform": "pytorch_torchscript",
                "inputs": [{"name": n, "datatype": dt or "", "shape": dims or []}
                           for n, dt, dims in self.inputs],
                "outputs": [{"name": n} for n in self.output_names]}


def _last_line(text):
    """TorchScript's errors end with the operator's own message, after a traceback."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _fill(dims, dtype, fill):
    if fill == "one":
        return torch.ones(dims, dtype=dtype)
    if fill == "random":
        return (torch.rand(dims) if dtype.is_floating_point
                else torch.randint(0, 10, dims).to(dtype))
    return torch.zeros(dims, dtype=dtype)


def _decode_tensor(i, item):
    if not isinstance(item, dict):
        raise BadRequest(f"inputs[{i}] must be an object {{name, shape, datatype, data}}")
    name, shape, datatype, data = (item.get(k) for k in ("name", "shape", "datatype", "data"))
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{i}]: 'name' must be a non-empty string")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BadRequest(f"inputs[{i}] ({name}): 'shape' must be a list of integers >= 0")
    if datatype not in DATATYPES:
        raise BadRequest(f"inputs[{i}] ({name}): datatype {datatype!r} is not supported; "
                         "supported: " + ", ".join(DATATYPES))
    if data is None:
        raise BadRequest(f"inputs[{i}] ({name}): 'data' is required")
    try:
        tensor = torch.tensor(data, dtype=DATATYPES[datatype])
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise BadRequest(f"inputs[{i}] ({name}): bad data for {datatype}: {e}")
    numel = 1
    for d in shape:
        numel *= d
    if tensor.numel() != numel:
        raise BadRequest(f"inputs[{i}] ({name}): shape {shape} needs {numel} values, data has "
                         f"{tensor.numel()}")
    return name, tensor.reshape(shape)


def load_repository(directory, warmup_runs=3, log=print):
    """{model: {version: ServedModel}} for every loadable version under directory."""
    import yaml  # python3-yaml

    models = {}
    for model_dir in sorted(Path(directory).iterdir()):
        if not model_dir.is_dir() or model_dir.name.startswith("."):
            continue
        config = {}
        config_file = model_dir / "config.yaml"
        if config_file.exists():
            config = yaml.safe_load(config_file.read_text()) or {}
        versions = {}
        for v_dir in sorted(model_dir.iterdir()):
            if not (_VERSION_RE.match(v_dir.name) and (v_dir / "model.pt").is_file()):
                continue
            try:
                served = ServedModel(model_dir.name, v_dir.name, v_dir / "model.pt", config)
                runs = served.warm_up(warmup_runs)
            except Exception as e:
                log(f"fastapi_baseline: model '{model_dir.name}' version {v_dir.name} refused: "
                    f"{type(e).__name__}: {e}")
                continue
            versions[v_dir.name] = served
            log(f"fastapi_baseline: model '{model_dir.name}' version {v_dir.name} ready "
                f"({runs} warmup runs)")
        if versions:
            models[model_dir.name] = versions
    return models


def create_app(directory=None, warmup_runs=None):
    """The FastAPI app serving `directory` (default: $SHOAL_BASELINE_REPOSITORY)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    directory = directory or os.environ["SHOAL_BASELINE_REPOSITORY"]
    if warmup_runs is None:
        warmup_runs = int(os.environ.get("SHOAL_BASELINE_WARMUP_RUNS", "3"))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    models = load_repository(directory, warmup_runs, log)

    app = FastAPI(title="fastapi_baseline", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status, message):
        return JSONResponse({"error": message}, status_code=status)

    def find(name, version):
        versions = models.get(name)
        if versions is None:
            raise BadRequest(f"unknown model '{name}'; the repository has: "
                             + ", ".join(sorted(models)), 404)
        if version is None:
            return versions[max(versions, key=int)]
        if version not in versions:
            raise BadRequest(f"model '{name}' has no version '{version}'; ready versions: "
                             + ", ".join(sorted(versions, key=int)), 404)
        return versions[version]

    @app.exception_handler(BadRequest)
    async def bad_request(_request, exc):
        return error(exc.status, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        if exc.status_code == 404:
            return error(404, f"no endpoint {request.method} {request.url.path}")
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, exc):
        return error(400, str(exc))

    @app.get("/v2/health/live")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready():
        return {"ready": True}

    @app.get("/v2")
    async def server_metadata():
        return {"name": "fastapi_baseline", "version": "1",
                "extensions": [], "backend": f"torch {torch.__version__}"}

    @app.get("/v2/models/{name}")
    async def model_metadata(name: str):
        m = find(name, None)
        return m.metadata(sorted(models[name], key=int))

    @app.get("/v2/models/{name}/versions/{version}")
    async def version_metadata(name: str, version: str):
        return find(name, version).metadata(sorted(models[name], key=int))

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str):
        return {"name": find(name, None).name, "ready": True}

    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def version_ready(name: str, version: str):
        return {"name": find(name, version).name, "ready": True}

    async def run_infer(name, version, request):
        model = find(name, version)
        body = await request.body()
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            return error(400, f"malformed JSON: {e}")
        if not isinstance(parsed, dict):
            return error(400, "the request body must be a JSON object")
        answer = model.infer(parsed)
        return Response(content=json.dumps(answer, separators=(",", ":")).encode(),
                        media_type="application/json")

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request):
        return await run_infer(name, None, request)

    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer_version(name: str, version: str, request: Request):
        return await run_infer(name, version, request)

    return app


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (default)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes; more than 1 runs gunicorn with uvicorn workers")
    parser.add_argument("--server", choices=["uvicorn", "gunicorn"], default=None,
                        help="default: uvicorn for one worker, gunicorn for more")
    parser.add_argument("--warmup-runs", type=int, default=3)
    args = parser.parse_args(argv)
    if not Path(args.model_repository).is_dir():
        print(f"fastapi_baseline: --model-repository {args.model_repository} is not a "
              "directory", file=sys.stderr)
        return 2
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    server = args.server or ("uvicorn" if args.workers == 1 else "gunicorn")
    if server == "uvicorn" and args.workers != 1:
        parser.error("--server uvicorn runs one worker; use gunicorn for more")

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(2048)
    port = sock.getsockname()[1]
    os.environ["SHOAL_BASELINE_REPOSITORY"] = str(Path(args.model_repository).resolve())
    os.environ["SHOAL_BASELINE_WARMUP_RUNS"] = str(args.warmup_runs)
    listening = f"fastapi_baseline: listening on http://{args.host}:{port}"

    if server == "uvicorn":
        import uvicorn

        app = create_app()  # models loaded and warmed up before the line below
        config = uvicorn.Config(app, loop="uvloop", http="httptools", access_log=False,
                                log_level="warning", timeout_keep_alive=120, backlog=2048,
                                lifespan="off")
        print(listening, flush=True)
        uvicorn.Server(config).run(sockets=[sock])
        return 0

    from gunicorn.app.base import BaseApplication

    class Gunicorn(BaseApplication):
        def load_config(self):
            for key, value in {"bind": [f"fd://{sock.fileno()}"], "workers": args.workers,
                               "worker_class": "uvicorn.workers.UvicornWorker",
                               "keepalive": 120, "accesslog": None, "loglevel": "warning",
                               "backlog": 2048, "timeout": 120}.items():
                self.cfg.set(key, value)

        def load(self):  # in each worker (no preload): its own models and torch threads
            return create_app()

    print(listening, flush=True)
    Gunicorn().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
