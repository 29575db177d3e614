"""The torchrun environment contract, as a real PyTorch task sees it."""

import json

import shoal_e2e as e2e

# Dumps its environment, then proves the contract works: a gloo process group over env://
# and an all_reduce of the ranks.
DUMP = """
import json, os, sys
out = sys.argv[1]
with open(os.path.join(out, f"env-{os.environ['SHOAL_INDEX']}.json"), "w") as f:
    json.dump(dict(os.environ), f)
with open(os.path.join(out, f"cwd-{os.environ['SHOAL_INDEX']}.txt"), "w") as f:
    f.write(os.getcwd())
import torch, torch.distributed as dist
dist.init_process_group(backend="gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum={t.item():g}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_pytorch_env_contract(tmp_path, write_file, write_job, run_shoal, jobs_dir):
    write_file("dump_env.py", DUMP)
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(f"""
        name: torchenv
        framework: pytorch
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "dump_env.py", "{out}"]
            resources: {{cpus: 1}}
        """)
    r = run_shoal("run", job, timeout=180)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    lines = r.stdout.splitlines()
    assert "worker:0 | rank 0 of 2 sum=1" in lines, r.stdout
    assert "worker:1 | rank 1 of 2 sum=1" in lines, r.stdout

    (job_dir,) = e2e.job_dirs(jobs_dir)
    job_id = job_dir.name
    envs = [json.loads((out / f"env-{i}.json").read_text()) for i in (0, 1)]
    cluster_files = set()
    for i, env in enumerate(envs):
        assert env["SHOAL_JOB_ID"] == job_id
        assert env["SHOAL_ROLE"] == "worker"
        assert env["SHOAL_INDEX"] == str(i)
        assert env["SHOAL_RANK"] == str(i)
        assert env["SHOAL_JOB_DIR"] == str(job_dir)
        assert env["RANK"] == str(i)
        assert env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] == str(i)
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0"
        assert env["GROUP_WORLD_SIZE"] == "1"
        assert env["ROLE_NAME"] == "worker"
        assert env["ROLE_RANK"] == str(i)
        assert env["ROLE_WORLD_SIZE"] == "2"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["TORCHELASTIC_RUN_ID"] == job_id
        assert env["OMP_NUM_THREADS"] == "1"
        # cwd is the job file's directory
        assert (out / f"cwd-{i}.txt").read_text() == str(tmp_path)

        spec = json.loads(open(env["SHOAL_CLUSTER_SPEC_FILE"]).read())
        cluster_files.add(env["SHOAL_CLUSTER_SPEC_FILE"])
        workers = spec["cluster"]["worker"]
        assert len(workers) == 2
        assert list(spec["cluster"]) == ["worker"]
        host0, port0 = workers[0].rsplit(":", 1)
        # MASTER_ADDR:MASTER_PORT is rank 0's address in the cluster spec
        assert env["MASTER_ADDR"] == host0
        assert env["MASTER_PORT"] == port0
        assert 0 < int(port0) < 65536
    # MASTER_PORT is the port reserved for rank 0: its SHOAL_TASK_PORT
    rank0 = next(e for e in envs if e["RANK"] == "0")
    assert envs[0]["MASTER_PORT"] == rank0["SHOAL_TASK_PORT"]
    assert envs[0]["SHOAL_TASK_PORT"] != envs[1]["SHOAL_TASK_PORT"]
    # both see the same rendezvous point and the same cluster
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"]
    specs = [json.loads(open(f).read()) for f in cluster_files]
    assert specs[0]["cluster"] == specs[-1]["cluster"]
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir), 10,
                   "every process of the job to exit")
