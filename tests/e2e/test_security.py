"""The job token (docs/configuration.md): mode 0600 in the job directory, given to the agent
through its environment, never on a command line, never to a task, never logged."""

import json
import stat

import shoal_e2e as e2e

DUMP = """
import json, os, sys
with open(sys.argv[1] + f"/env-{os.environ['SHOAL_INDEX']}.json", "w") as f:
    json.dump(dict(os.environ), f)
print("dumped", flush=True)
"""


def test_token_stays_secret(tmp_path, write_file, write_job, detach_job, jobs_dir,
                            wait_for_state, run_shoal):
    script = write_file("dump.py", DUMP)
    out = tmp_path / "out"
    out.mkdir()
    ready = tmp_path / "go"
    job = write_job(f"""
        name: secret
        framework: pytorch
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "/usr/bin/python3 {script} {out} && while [ ! -e {ready} ]; do sleep 0.05; done"]
            resources: {{cpus: 0.5}}
        """)
    job_id = detach_job(job)
    job_dir = jobs_dir / job_id
    token_file = job_dir / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32

    wait_for_state(job_id, lambda s: s["state"] == "running"
                   and all(t["state"] == "running" for t in s["tasks"]), 60, "running")
    e2e.wait_until(lambda: len(list(out.glob("env-*.json"))) == 2, 30, "both env dumps")
    # No live process of the job shows the token on its command line (ps shows argv to all).
    procs = e2e.job_processes(job_id, job_dir)
    assert any(" agent " in f" {p.cmdline} " for p in procs), procs
    for p in procs:
        assert token not in p.cmdline, f"the token is on the command line of {p}"
    # Tasks never receive it, under any name.
    for f in out.glob("env-*.json"):
        env = json.loads(f.read_text())
        assert "SHOAL_AGENT_TOKEN" not in env
        assert not [k for k, v in env.items() if token in v], f"token in a task's environment"

    ready.write_text("go")
    final = wait_for_state(job_id, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 60, "end")
    assert final["state"] == "succeeded"
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir), 10, "the job's processes")
    # Never logged: nowhere in the job directory but the token file itself.
    for path in job_dir.rglob("*"):
        if path.is_file() and path != token_file:
            assert token not in path.read_text(errors="replace"), f"token written to {path}"
    r = run_shoal("logs", job_id, timeout=30)
    assert token not in r.stdout
