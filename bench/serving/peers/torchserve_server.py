"""TorchServe 0.12 for bench/serving_peers.py: archives the model (no-archive format) with
torchserve_handler.py, writes config.properties (2 workers, batching, a deep job queue, quiet
logs, no token authorisation, Prometheus metrics rather than per-request metric log lines) and
runs `torchserve --foreground`. Run it with the peer-torchserve venv's Python; needs a JDK."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _peer_args  # noqa: E402

LOG4J = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders><Console name="STDOUT" target="SYSTEM_OUT">
    <PatternLayout pattern="%d{ISO8601} [%-5p] %t %c - %m%n"/></Console></Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="STDOUT"/></Root></Loggers>
</Configuration>
"""


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = _peer_args.parse(__doc__.split("\n\n")[0])
    work = Path(args.work_dir)
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    (work / "signature.json").write_text(json.dumps({"dtype": args.dtype}))
    venv_bin = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{venv_bin}:{os.environ.get('PATH', '')}",
               OMP_NUM_THREADS="1", LOG_LOCATION=str(work / "logs"),
               METRICS_LOCATION=str(work / "logs"), TS_DISABLE_SYSTEM_METRICS="true",
               # TorchServe keeps its pid file in the temporary directory and refuses to start
               # while one is there: one of its own, so that no other TorchServe is in the way.
               TMPDIR=str(work))
    subprocess.run([str(venv_bin / "torch-model-archiver"), "--model-name", args.model,
                    "--version", "1.0", "--serialized-file", args.model_file,
                    "--handler", str(Path(__file__).resolve().parent / "torchserve_handler.py"),
                    "--extra-files", str(work / "signature.json"), "--export-path", str(store),
                    "--archive-format", "no-archive"], check=True, env=env)
    (work / "log4j2.xml").write_text(LOG4J)
    models = {args.model: {"1.0": {
        "defaultVersion": True, "marName": args.model, "minWorkers": args.workers,
        "maxWorkers": args.workers, "batchSize": args.max_batch_size,
        "maxBatchDelay": int(round(args.batch_delay_ms)), "responseTimeout": 120}}}
    config = {
        "inference_address": f"http://127.0.0.1:{args.port}",
        "management_address": f"http://127.0.0.1:{free_port()}",
        "metrics_address": f"http://127.0.0.1:{free_port()}",
        "model_store": str(store),
        "load_models": args.model,
        "models": json.dumps(models),
        "default_workers_per_model": str(args.workers),
        "job_queue_size": "4096",
        "disable_token_authorization": "true",
        "enable_envvars_config": "false",
        "disable_system_metrics": "true",
        "metrics_mode": "prometheus",
        "async_logging": "true",
        "vmargs": f"-Xmx1g -XX:+UseContainerSupport "
                  f"-Dlog4j.configurationFile=file://{work / 'log4j2.xml'}",
    }
    (work / "config.properties").write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    os.execve(str(venv_bin / "torchserve"),
              [str(venv_bin / "torchserve"), "--start", "--foreground", "--ncs",
               "--ts-config", str(work / "config.properties"), "--model-store", str(store),
               "--disable-token-auth"], env)


if __name__ == "__main__":
    main()
