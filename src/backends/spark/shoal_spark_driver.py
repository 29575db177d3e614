"""Shoal's Spark driver program: runs one Shoal job's gang as one barrier stage.

The Spark backend (spark_backend.cc) writes this file into the job directory and starts it with
a Python that has PySpark, beside the Shoal master, in client mode. Its only argument is a JSON
file with the settings (Spark master, conf, the places, the agents' command line); the agents'
token comes in the environment (SHOAL_AGENT_TOKEN), never on a command line.

It creates the application, runs a barrier stage with one task per place and reports what
happens as lines `SHOAL-SPARK {json}` on stdout, which the backend reads:

  application  the SparkContext is up: {"app_id", "ui"}
  queued       the barrier stage has not started: {"reason"} (each new reason once)
  gang         every barrier task of a stage attempt runs: {"attempt"}
  attempt_failed  a stage attempt failed (Spark killed all its tasks; it may retry): {"attempt", "reason"}
  finished     the stage ended: {"ok", "reason"}

Each barrier task starts one `shoal agent` for its place and lives as long as the agent: an
agent that exits 0 (the master ended the job) completes the task; any other end fails it, and
with it the stage attempt, which Spark then retries as a whole
(spark.stage.maxConsecutiveAttempts). SIGTERM cancels the stage and stops the application.
"""

import json
import os
import signal
import sys
import threading
import time


def emit(kind, **fields):
    print("SHOAL-SPARK " + json.dumps(dict(kind=kind, **fields)), flush=True)


def make_place_runner(settings, token):
    """The barrier tasks' function; everything it needs is in its closure (pickled with it)."""
    places = settings["places"]
    agent_args = settings["agent_args"]
    shoal_binary = settings["shoal_binary"]
    ship_binary = settings["ship_binary"]

    def run_place(index, _rows):
        import ctypes
        import subprocess
        from pyspark import BarrierTaskContext, SparkFiles

        context = BarrierTaskContext.get()
        place = places[index]
        binary = shoal_binary
        if ship_binary:
            binary = SparkFiles.get(os.path.basename(shoal_binary))
            os.chmod(binary, 0o755)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
        if settings.get("pythonpath"):
            env["PYTHONPATH"] = settings["pythonpath"]
        env["SHOAL_AGENT_TOKEN"] = token
        argv = [binary, "agent", "--node", place["name"]] + agent_args
        if place["gpus"] > 0:
            # Spark's scheduler chose these among the executor's GPUs; the agent offers them
            # (and only them) to the place's task, as CUDA_VISIBLE_DEVICES.
            gpus = context.resources().get("gpu")
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.addresses if gpus else [])
            argv.append("--gpus-from-env")
        work_dir = os.path.join(os.getcwd(), "shoal-agent-" + place["name"])
        os.makedirs(work_dir, exist_ok=True)
        argv += ["--work-dir", work_dir]
        libc = ctypes.CDLL(None, use_errno=True)

        def die_with_task():
            # The agent (and through it the place's tasks) ends when this Python worker does:
            # Spark kills the worker of a cancelled or failed barrier task.
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

        agent = subprocess.Popen(argv, env=env, cwd=work_dir, preexec_fn=die_with_task,
                                 stdin=subprocess.DEVNULL)
        try:
            rc = agent.wait()
        finally:
            if agent.poll() is None:
                agent.terminate()
        if rc != 0:
            raise RuntimeError(
                f"the Shoal agent for {place['name']} on {context.getTaskInfos()[index].address}"
                f" exited with status {rc}")
        yield (place["name"], rc)

    return run_place


def main():
    with open(sys.argv[1]) as f:
        settings = json.load(f)
    token = os.environ.get("SHOAL_AGENT_TOKEN", "")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAppName(settings["app_name"]).setMaster(settings["master"])
    for key, value in settings["conf"].items():
        conf.set(key, value)
    sc = SparkContext(conf=conf)
    sc.setLogLevel(settings.get("log_level", "WARN"))
    if settings["ship_binary"]:
        sc.addFile(settings["shoal_binary"])
    emit("application", app_id=sc.applicationId, ui=sc.uiWebUrl or "")

    n = len(settings["places"])
    result = {}

    def run_stage():
        sc.setJobGroup("shoal", settings["app_name"], interruptOnCancel=True)
        try:
            rdd = sc.parallelize(range(n), n)
            result["rows"] = rdd.barrier().mapPartitionsWithIndex(
                make_place_runner(settings, token)).collect()
        except Exception as e:  # the job failed: Spark's message is the reason
            text = str(e)
            result["error"] = text.strip().splitlines()[0] if text.strip() else repr(e)
            for line in text.splitlines():
                if "Shoal agent" in line or "SPARK-24819" in line or "Barrier" in line:
                    result["error"] = line.strip()
                    break

    stage = threading.Thread(target=run_stage, daemon=True)
    stage.start()
    tracker = sc.statusTracker()
    jvm_sc = sc._jsc.sc()
    last_reason, gang_attempt, failed_seen = None, None, set()
    while stage.is_alive():
        if stopping.is_set():
            sc.cancelJobGroup("shoal")
            break
        info = None
        for job_id in tracker.getJobIdsForGroup("shoal"):
            job = tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job else []):
                info = tracker.getStageInfo(stage_id) or info
        if info is None or info.numActiveTasks == 0:
            executors = max(0, jvm_sc.getExecutorMemoryStatus().size() - 1)
            reason = (f"Spark has not started the barrier stage of {sc.applicationId} yet: it "
                      f"needs {n} task slots at once ({settings['task_resources']} each); "
                      f"{executors} executor{'s' if executors != 1 else ''} registered")
            if gang_attempt is not None and info is not None:
                reason = (f"Spark is retrying the barrier stage of {sc.applicationId} "
                          f"(attempt {info.currentAttemptId})")
            if reason != last_reason:
                emit("queued", reason=reason)
                last_reason = reason
        elif info.numActiveTasks >= n and gang_attempt != info.currentAttemptId:
            gang_attempt = info.currentAttemptId
            last_reason = None
            emit("gang", attempt=gang_attempt)
        if info is not None and gang_attempt is not None and gang_attempt not in failed_seen \
                and (info.numFailedTasks > 0 or info.currentAttemptId != gang_attempt):
            failed_seen.add(gang_attempt)
            emit("attempt_failed", attempt=gang_attempt,
                 reason=f"a barrier task of stage attempt {gang_attempt} failed")
        time.sleep(0.2)
    stage.join(timeout=60 if stopping.is_set() else None)
    if stopping.is_set():
        emit("finished", ok=False, reason="stopped by Shoal")
    elif "error" in result:
        emit("finished", ok=False, reason=result["error"])
    else:
        emit("finished", ok=True, reason="every agent exited 0")
    sc.stop()


if __name__ == "__main__":
    main()
