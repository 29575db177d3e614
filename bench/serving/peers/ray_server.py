"""Ray Serve for bench/serving_peers.py: a local Ray (no dashboard), one deployment with
`workers` replicas, each batching with @serve.batch, at POST /M with {"data": [row]} ->
{"output": [row]}. max_ongoing_requests is raised above the batch size (its default, 5, would
cap every batch at 5). Prints `ray_server: listening on http://127.0.0.1:PORT` once the
deployment is up, then runs until SIGTERM. Run it with the peer-ray venv's Python."""

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _peer_args  # noqa: E402


def main():
    args = _peer_args.parse(__doc__.split("\n\n")[0])
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["OMP_NUM_THREADS"] = "1"
    import ray
    from ray import serve

    # Ray's session directory holds its AF_UNIX sockets (107 bytes at most): a short path.
    ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    # For bench/serving_peers.py to remove, should this process not get to.
    (Path(args.work_dir) / "ray-temp-dir").write_text(ray_dir)
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
             log_to_driver=False, _temp_dir=ray_dir)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                logging_config={"log_level": "WARNING", "enable_access_log": False})

    batch = serve.batch(max_batch_size=args.max_batch_size,
                        batch_wait_timeout_s=args.batch_delay_ms / 1000.0)

    @serve.deployment(num_replicas=args.workers, ray_actor_options={"num_cpus": 0},
                      max_ongoing_requests=max(8, 2 * args.max_batch_size))
    class TorchScriptDeployment:
        def __init__(self, path, dtype):
            _peer_args.one_thread()
            self.module = _peer_args.load(path)
            self.dtype = dtype

        @batch
        async def run(self, rows):
            return _peer_args.run_rows(self.module, rows, self.dtype)

        async def __call__(self, request):
            body = await request.json()
            return {"output": await self.run(body["data"])}

    serve.run(TorchScriptDeployment.bind(args.model_file, args.dtype), name=args.model,
              route_prefix=f"/{args.model}")
    print(f"ray_server: listening on http://127.0.0.1:{args.port}", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        time.sleep(0.2)
    serve.shutdown()
    ray.shutdown()
    shutil.rmtree(ray_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
