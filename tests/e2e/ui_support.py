"""A running `shoal ui` for the end-to-end tests, its address read from the line it prints."""

import http.client
import json
import signal
import subprocess
import urllib.parse

import shoal_e2e as e2e


class Ui:
    def __init__(self, shoal_bin, jobs_dir, out_dir, *extra, listen="127.0.0.1:0"):
        self.stdout_path = out_dir / "ui.stdout"
        self.stderr_path = out_dir / "ui.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [shoal_bin, "--jobs-dir", str(jobs_dir), "ui", "--listen", listen, *map(str, extra)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=e2e.base_env(),
                start_new_session=True)
        line = e2e.wait_until(self._address_line, 30, "shoal ui to print its address")
        # "shoal ui: http://127.0.0.1:PORT/ (jobs in ...)"
        self.base = line.split()[2].rstrip("/")
        self.port = urllib.parse.urlparse(self.base).port

    def _address_line(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"shoal ui exited with {self.proc.returncode}:\n"
                                 f"{self.stderr_path.read_text(errors='replace')}")
        lines = self.stdout_path.read_text().splitlines()
        return lines[0] if lines else None

    def request(self, method, path, headers=None, body=None):
        """(status, headers dict, body bytes) of one request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def get_json(self, path, expect=200, headers=None):
        status, _, body = self.request("GET", path, headers=headers)
        assert status == expect, f"GET {path}: {status} {body[:300]!r}"
        return json.loads(body)

    def post_json(self, path, expect, headers=None):
        h = {"X-Shoal-Request": "1"}
        h.update(headers or {})
        status, _, body = self.request("POST", path, headers=h)
        assert status == expect, f"POST {path}: {status} {body[:300]!r}"
        return json.loads(body)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("shoal ui did not stop within 20 s of SIGTERM")
        return self.proc.returncode
