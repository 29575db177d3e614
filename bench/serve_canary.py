#!/usr/bin/env python3
"""Canary rollout under load (docs/serving.md, "Canary rollout and rollback"): the fraction of
requests affected when a bad version is published, and the promotion of a good one.

One `shoal serve` with a model whose config has a canary policy; closed-loop HTTP clients send
unversioned requests throughout. Three publications in turn, each on a fresh server:
  raises       a version whose forward raises        -> rolled back
  wrong_shape  a version answering the wrong shape   -> rolled back
  good         a version answering correctly         -> promoted
For each: requests sent while it was published, requests failed (any non-200, as the callers
saw them), requests the canary failed and the current version answered instead (fallbacks, from
/metrics), seconds from publication to the decision, the decision and its reason.

  bench/serve_canary.py [--shoal PATH] [--clients 4] [--share 0.05] [--duration-s 5]
                        [--min-requests 100] [--after-s 2]

Prints one JSON object on stdout; progress on stderr.
"""

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CONFIG = """\
inputs: [{{name: x, datatype: FP32, dims: [1]}}]
outputs: [{{name: y, datatype: FP32, dims: [1]}}]
rollout:
  canary: {{share: {share}, duration_s: {duration}, min_requests: {min_requests},
           max_error_rate: 0.01, max_p99_ratio: 0}}
"""

MODELS = r"""
import sys, torch
class Good(torch.nn.Module):
    def __init__(self, v: float):
        super().__init__()
        self.v = v
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.0 + self.v
class Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > -1.0e30):
            raise RuntimeError("deliberately broken version")
        return x
class WrongShape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x])
out = sys.argv[1]
torch.jit.script(Good(1.0)).save(out + "/good1.pt")
torch.jit.script(Good(2.0)).save(out + "/good2.pt")
torch.jit.script(Raises()).save(out + "/raises.pt")
torch.jit.script(WrongShape()).save(out + "/wrong_shape.pt")
"""


class Load:
    """Closed-loop clients on kept-alive connections, counting answers."""

    def __init__(self, port, clients):
        self.port = port
        self.lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self.versions = {}
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join()

    def counts(self):
        with self.lock:
            return self.ok, self.failed

    def _run(self):
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                       "data": [0.0]}]})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stopping.is_set():
            try:
                conn.request("POST", "/v2/models/m/infer", body=body)
                response = conn.getresponse()
                reply = json.loads(response.read())
                good = response.status == 200
                version = reply.get("model_version") if good else None
            except (OSError, http.client.HTTPException, ValueError):
                good, version = False, None
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            with self.lock:
                if good:
                    self.ok += 1
                    self.versions[version] = self.versions.get(version, 0) + 1
                else:
                    self.failed += 1
        conn.close()


def metric(port, name, model="m"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    match = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None


def one_publication(shoal, models_dir, work, kind, args):
    repo = work / f"repo-{kind}"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.yaml").write_text(CONFIG.format(
        share=args.share, duration=args.duration_s, min_requests=args.min_requests))
    (repo / "m" / "1" / "model.pt").write_bytes((models_dir / "good1.pt").read_bytes())
    err_path = work / f"serve-{kind}.stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [shoal, "serve", "--model-repository", str(repo), "--http-port", "0", "--grpc-port",
             "0", "--repository-poll-ms", "50", "--repository-settle-ms", "200"],
            stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        line = proc.stdout.readline().decode()
        port = int(line.rsplit(":", 1)[1])
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v2/health/ready")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        load = Load(port, args.clients)
        load.start()
        time.sleep(1.0)
        ok0, failed0 = load.counts()
        staging = repo / "m" / ".staging-2"
        staging.mkdir()
        source = {"raises": "raises.pt", "wrong_shape": "wrong_shape.pt", "good": "good2.pt"}[kind]
        (staging / "model.pt").write_bytes((models_dir / source).read_bytes())
        published = time.time()
        staging.rename(repo / "m" / "2")
        wanted = "promoted" if kind == "good" else "rolled back"
        decided = None
        decision_line = None
        while time.time() < published + args.duration_s + 120:
            text = err_path.read_text(errors="replace")
            match = re.search(r"^shoal serve: model 'm' version 2 (promoted|rolled back) .*$",
                              text, re.M)
            if match:
                decided = time.time()
                decision_line = match.group(0)
                break
            time.sleep(0.02)
        time.sleep(args.after_s)
        load.stop()
        ok1, failed1 = load.counts()
        requests = (ok1 - ok0) + (failed1 - failed0)
        failed = failed1 - failed0
        fallbacks = metric(port, "shoal_serve_canary_fallbacks_total") or 0
        result = {
            "expected": wanted,
            "decision_line": decision_line,
            "seconds_to_decision": round(decided - published, 3) if decided else None,
            "requests_after_publication": requests,
            "failed": failed,
            "failed_fraction": failed / requests if requests else None,
            "fallbacks": int(fallbacks),
            "fallback_fraction": fallbacks / requests if requests else None,
            "answers_by_version_whole_run": dict(load.versions),
        }
        if decision_line is None or wanted not in decision_line:
            result["error"] = f"expected '{wanted}' within the time limit"
        return result
    finally:
        proc.kill()
        proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_shoal_arg(parser)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.05)
    parser.add_argument("--duration-s", type=float, default=5)
    parser.add_argument("--min-requests", type=int, default=100)
    parser.add_argument("--after-s", type=float, default=2,
                        help="load kept on after the decision (counted)")
    parser.add_argument("--python", default=_common.DEFAULT_PYTHON)
    args = parser.parse_args()
    shoal, why = _common.find_shoal(args.shoal)
    if not shoal:
        _common.emit({"error": why})
        return 2
    result = {"config": {"clients": args.clients, "share": args.share,
                         "duration_s": args.duration_s, "min_requests": args.min_requests,
                         "max_error_rate": 0.01}}
    with _common.temp_dir("shoal-canary-bench-") as work:
        models = work / "models-src"
        models.mkdir()
        # TorchScript reads the classes' source: a file, not `python -c`.
        script = work / "make_models.py"
        script.write_text(MODELS)
        made = subprocess.run([args.python, str(script), str(models)], capture_output=True,
                              text=True)
        if made.returncode != 0:
            result["error"] = f"exporting the models failed:\n{made.stderr[-2000:]}"
            _common.emit(result)
            return 1
        for kind in ("raises", "wrong_shape", "good"):
            _common.log(f"publishing a {kind} version under load")
            try:
                result[kind] = one_publication(shoal, models, work, kind, args)
            except Exception as e:  # noqa: BLE001 -- a driver reports, never asserts
                result[kind] = {"error": repr(e)}
    _common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
