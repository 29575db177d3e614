"""A model published from Python with shoal.publish_model is served by a running `shoal serve`:
the new version replaces the old one with no failed request in between."""

import json
import subprocess
import textwrap
import threading
import urllib.error
import urllib.request

import shoal_e2e as e2e

PUBLISHER = """
import sys, torch, shoal

class Scale(torch.nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k

print(shoal.publish_model(Scale(float(sys.argv[2])), "scale", repository=sys.argv[1],
                          example_inputs=torch.zeros(1, 4), config={"max_batch_size": 8}))
"""


def infer(base):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 1, 1, 1]}]}).encode()
    req = urllib.request.Request(f"{base}/v2/models/scale/infer", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    return out["model_version"], out["outputs"][0]["data"][0]


def test_a_published_version_takes_over_without_a_failed_request(shoal_bin, tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    publisher = tmp_path / "publish.py"
    publisher.write_text(textwrap.dedent(PUBLISHER))

    def publish(k):
        r = subprocess.run([e2e.PYTHON, str(publisher), str(repo), str(k)], capture_output=True,
                           text=True, timeout=120, env=e2e.base_env())
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip())

    assert publish(2) == 1
    out = open(tmp_path / "serve.out", "wb")
    serve = subprocess.Popen([shoal_bin, "serve", "--model-repository", str(repo), "--http-port", "0",
                              "--grpc-port", "0", "--repository-poll-ms", "100",
                              "--repository-settle-ms", "200"],
                             stdout=out, stderr=subprocess.STDOUT, env=e2e.base_env(),
                             start_new_session=True)
    try:
        line = e2e.wait_until(lambda: next((l for l in (tmp_path / "serve.out").read_text().splitlines()
                                            if "listening on http://" in l), None), 60, "shoal serve")
        base = line.split("listening on ")[1].split()[0]

        def served():
            try:
                return infer(base)
            except urllib.error.URLError:
                return None
        assert e2e.wait_until(served, 60, "version 1 to serve") == ("1", 2.0)
        failures, answers, stop = [], [], threading.Event()

        def load():
            while not stop.is_set():
                try:
                    answers.append(infer(base))
                except Exception as e:  # noqa: BLE001 - counted, then asserted on
                    failures.append(repr(e))
        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            assert publish(3) == 2
            e2e.wait_until(lambda: answers and answers[-1] == ("2", 3.0), 60, "version 2 to serve")
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not failures, failures[:3]
        assert set(answers) <= {("1", 2.0), ("2", 3.0)}
        # Once version 2 answered, version 1 never did again.
        first_new = answers.index(("2", 3.0))
        assert ("1", 2.0) not in answers[first_new + 1:]
        config = (repo / "scale" / "config.yaml").read_text()
        assert "max_batch_size: 8" in config and "dims: [4]" in config
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        out.close()
