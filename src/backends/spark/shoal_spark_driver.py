"""Shoal's Spark driver program: runs one Shoal job's gang as one barrier stage.

The Spark backend (spark_backend.cc) writes this file into the job directory and starts it with
a Python that has PySpark, beside the Shoal master, in client mode. Its only argument is a JSON
file with the settings (Spark master, conf, the places, the agents' command line); the agents'
token comes in the environment (SHOAL_AGENT_TOKEN), never on a command line.

It creates the application and runs a barrier stage with one task per place. Each barrier task
dials back to this program (a TCP connection to the driver's host, authenticated by a random
key shipped in the task's closure) and keeps the connection for its life: the connection says
which place it serves, carries the task's news (its agent started, its agent exited) and this
program's commands (start the place's agent, terminate it, end), and its end says that the task
is gone (its executor was lost, or Spark killed the stage attempt).

What happens is reported as lines `SHOAL-SPARK {json}` on stdout, which the backend reads:

  application     the SparkContext is up: {"app_id", "ui"}
  queued          the barrier stage has not started: {"reason"}
  gang            every place has a barrier task that dialled back: {"attempt"}
  agent_started   {"place", "host", "attempt"}
  agent_failed    the place's barrier task could not start its agent: {"place", "host", "error"}
  place_lost      the place's agent or its barrier task ended: {"place", "reason"}
  finished        the stage ended: {"ok", "reason"}

and commands come as lines on stdin: `replace PLACE` (start a new agent for the place, in the
running task or, after a failed stage attempt, in the retried one), `terminate PLACE`, `end`.
"""

import json
import os
import secrets
import select
import signal
import socket
import sys
import threading
import time


def emit(kind, **fields):
    print("SHOAL-SPARK " + json.dumps(dict(kind=kind, **fields)), flush=True)


def make_place_runner(settings, token, driver_address, key):
    """The barrier tasks' function; everything it needs is in its closure (pickled with it)."""
    places = settings["places"]
    agent_args = settings["agent_args"]
    shoal_binary = settings["shoal_binary"]
    ship_binary = settings["ship_binary"]
    pythonpath = settings.get("pythonpath", "")

    def run_place(index, _rows):
        import ctypes
        import json
        import os
        import signal
        import socket
        import subprocess
        import sys
        import threading
        import time
        from pyspark import BarrierTaskContext, SparkFiles

        context = BarrierTaskContext.get()
        place = places[index]
        attempt = context.attemptNumber()  # how many times Spark has run this place's task
        binary = shoal_binary
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        env["SHOAL_AGENT_TOKEN"] = token
        argv = [binary, "agent", "--node", place["name"]] + agent_args
        if place["gpus"] > 0:
            # Spark's scheduler chose these among the executor's GPUs; the agent offers them
            # (and only them) to the place's task, as CUDA_VISIBLE_DEVICES.
            gpus = context.resources().get("gpu")
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.addresses if gpus else [])
            argv.append("--gpus-from-env")
        work_dir = os.path.join(os.getcwd(), f"shoal-agent-{place['name']}-{attempt}")
        os.makedirs(work_dir, exist_ok=True)
        argv += ["--work-dir", work_dir]
        libc = ctypes.CDLL(None, use_errno=True)

        def die_with_task():
            # The agent (and through it the place's tasks) ends when this Python worker does:
            # Spark kills the worker of a cancelled or failed barrier task.
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

        conn = socket.create_connection(driver_address, timeout=60)
        conn.settimeout(0.2)
        host = socket.gethostname()

        def send(**message):
            conn.sendall((json.dumps(message) + "\n").encode())

        send(key=key, place=place["name"], attempt=attempt, host=host)
        agent, buffered, ended = None, b"", False
        started, refusals = 0, 0
        refused = threading.Event()

        def relay(stream):
            # The agent's log goes on to the executor's stderr; a refusal by the master is
            # noted: after Spark's retry of the stage, a new agent may register before the
            # master has seen the old one of its place go ("already registered").
            for raw in stream:
                if b"the master refused this agent" in raw:
                    refused.set()
                sys.stderr.buffer.write(raw)
                sys.stderr.flush()

        def start_agent():
            refused.clear()
            if ship_binary:
                shipped = SparkFiles.get(os.path.basename(shoal_binary))
                os.chmod(shipped, 0o755)
                argv[0] = shipped
            process = subprocess.Popen(argv, env=env, cwd=work_dir, preexec_fn=die_with_task,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT)
            relay_thread = threading.Thread(target=relay, args=(process.stdout,), daemon=True)
            relay_thread.start()
            process.relay_thread = relay_thread
            return process

        def stop_agent():
            if agent is not None and agent.poll() is None:
                agent.terminate()
                try:
                    agent.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()

        try:
            while not ended:
                try:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break  # the driver is gone
                    buffered += chunk
                except socket.timeout:
                    pass
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    command = line.decode().strip()
                    if command == "start" and (agent is None or agent.poll() is not None):
                        try:
                            agent = start_agent()
                        except Exception as e:  # noqa: BLE001 - any cause is the job's reason
                            # No retry of the stage can help (a binary this executor cannot
                            # run, a missing file): tell the driver why and stay, so that Spark
                            # does not retry the gang, until the driver ends the task.
                            agent = None
                            send(event="agent_failed", error=f"{type(e).__name__}: {e}",
                                 binary=argv[0])
                            continue
                        started += 1
                        send(event="agent_started", pid=agent.pid)
                    elif command == "terminate":
                        stop_agent()
                    elif command == "end":
                        ended = True
                if agent is not None and agent.poll() is not None:
                    rc = agent.returncode
                    agent.relay_thread.join(timeout=5)
                    if rc == 0 and refused.is_set() and refusals < 60:
                        # Refused while the master still held the place's previous agent: the
                        # place was asked for, so ask again once that agent is gone.
                        refusals += 1
                        time.sleep(1)
                        agent = start_agent()
                        continue
                    agent = None
                    send(event="agent_exited", status=rc)
                    if rc == 0:
                        break  # the master ended the job (or needs the place no more)
        finally:
            stop_agent()
            conn.close()
        yield (place["name"], started)

    return run_place


def watch_yarn_admission(app_name, up):
    """Master yarn: until the SparkContext is up (`up` set), reports why YARN has not started the
    application's master yet (its queue full, no room for the AM container), in YARN's words,
    as `queued`. SparkContext() blocks until the application runs, and says nothing meanwhile."""
    from pyspark import SparkContext
    jvm = SparkContext._jvm
    try:
        records = jvm.org.apache.hadoop.yarn.api.records
        client = jvm.org.apache.hadoop.yarn.client.api.YarnClient.createYarnClient()
        client.init(jvm.org.apache.hadoop.yarn.conf.YarnConfiguration())
        client.start()
    except Exception as e:  # no reason to report is no reason to fail the job
        print(f"cannot watch YARN's admission of {app_name}: {e}", file=sys.stderr, flush=True)
        return
    try:
        types = jvm.java.util.HashSet()
        types.add("SPARK")
        states = jvm.java.util.EnumSet.noneOf(
            jvm.java.lang.Class.forName("org.apache.hadoop.yarn.api.records.YarnApplicationState"))
        for state in ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED"):
            states.add(getattr(records.YarnApplicationState, state))
        last = None
        while not up.wait(1.0):
            for report in client.getApplications(types, states):
                if report.getName() != app_name:
                    continue
                diagnostics = " ".join((report.getDiagnostics() or "").split())
                reason = (f"YARN has not started the application master of {app_name} "
                          f"({report.getApplicationId().toString()}, queue {report.getQueue()}) "
                          f"yet: {report.getYarnApplicationState().toString()}"
                          + (f": {diagnostics}" if diagnostics else ""))
                if reason != last:
                    emit("queued", reason=reason)
                    last = reason
    except Exception as e:
        if not up.is_set():
            print(f"stopped watching YARN's admission of {app_name}: {e}", file=sys.stderr,
                  flush=True)
    finally:
        try:
            client.stop()
        except Exception:
            pass


class Places:
    """The barrier tasks that dialled back, by place, and what each place should do next."""

    def __init__(self, names, key):
        self.lock = threading.Lock()
        self.names = names
        self.key = key
        self.conns = {}          # place -> the socket of its current barrier task
        self.attempts = {}       # place -> that task's stage attempt
        self.wanted = {n: "start" for n in names}  # start | wait | done
        self.running = set()     # places whose agent runs
        self.hosts = {}          # place -> the host of its current barrier task
        self.ending = False

    def command(self, place, text):
        conn = self.conns.get(place)
        if conn is not None:
            try:
                conn.sendall((text + "\n").encode())
            except OSError:
                pass

    def serve(self, conn):
        buffered = b""
        place = None
        conn.settimeout(None)
        try:
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                buffered += chunk
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    message = json.loads(line)
                    if place is None:
                        if message.get("key") != self.key or message.get("place") not in self.wanted:
                            return
                        place = message["place"]
                        self.hello(place, conn, message)
                    else:
                        self.news(place, message)
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
            if place is not None:
                self.gone(place, conn)

    def hello(self, place, conn, message):
        lost_host = None
        with self.lock:
            old = self.conns.get(place)
            if old is not None and place in self.running and not self.ending:
                # A retried attempt's task came before the old one's end was seen: the old
                # task's agent is lost all the same.
                lost_host = self.hosts.get(place)
                self.running.discard(place)
                if self.wanted[place] != "done":
                    self.wanted[place] = "wait"
            self.conns[place] = conn
            self.attempts[place] = message.get("attempt", 0)
            self.hosts[place] = message.get("host", "")
            if self.ending or self.wanted[place] == "done":
                self.command(place, "end")
            elif self.wanted[place] == "start":
                self.command(place, "start")
            if all(n in self.conns for n in self.names):
                emit("gang", attempt=self.attempts[place])
        if lost_host is not None:
            emit("place_lost", place=place,
                 reason=f"its Spark barrier task on {lost_host} was replaced by Spark's retry of "
                        f"the stage")
        if old is not None:
            try:
                old.close()
            except OSError:
                pass

    def news(self, place, message):
        event = message.get("event")
        if event == "agent_started":
            with self.lock:
                self.running.add(place)
            emit("agent_started", place=place, host=self.hosts.get(place, ""),
                 attempt=self.attempts.get(place, 0), pid=message.get("pid"))
        elif event == "agent_failed":
            with self.lock:
                self.running.discard(place)
                self.wanted[place] = "wait"
            emit("agent_failed", place=place, host=self.hosts.get(place, ""),
                 error=message.get("error", ""), binary=message.get("binary", ""))
        elif event == "agent_exited":
            status = message.get("status")
            with self.lock:
                self.running.discard(place)
                self.wanted[place] = "done" if status == 0 else "wait"
            if status != 0:
                emit("place_lost", place=place,
                     reason=f"its agent exited with status {status} on {self.hosts.get(place)}")

    def gone(self, place, conn):
        with self.lock:
            if self.conns.get(place) is not conn:
                return  # replaced by a newer attempt's task
            del self.conns[place]
            was_running = place in self.running
            self.running.discard(place)
            if self.wanted[place] != "done":
                self.wanted[place] = "wait"
            ending = self.ending
        if was_running and not ending:
            emit("place_lost", place=place,
                 reason=f"its Spark barrier task on {self.hosts.get(place)} ended (its executor "
                        f"was lost, or Spark failed the stage attempt)")

    def replace(self, place):
        with self.lock:
            if place not in self.wanted:
                return
            self.wanted[place] = "start"
            if place in self.conns:
                self.command(place, "start")

    def terminate(self, place):
        with self.lock:
            self.command(place, "terminate")

    def end(self):
        with self.lock:
            self.ending = True
            for place in list(self.conns):
                self.command(place, "end")


def use_spark_home_of_our_own():
    """Master local-cluster[...]: Spark's workers run inside the driver's JVM and keep their
    executors' folders under $SPARK_HOME/work, which is PySpark's own folder in the user's
    venv. A SPARK_HOME here (in the job's folder) that links to every entry of the real one
    but `work` keeps the job's files with the job, and the venv unchanged."""
    from pyspark.find_spark_home import _find_spark_home
    real = os.path.realpath(_find_spark_home())
    home = os.path.join(os.getcwd(), "spark-home")
    os.makedirs(os.path.join(home, "work"), exist_ok=True)
    for entry in sorted(os.listdir(real)):
        link = os.path.join(home, entry)
        if entry != "work" and not os.path.lexists(link):
            os.symlink(os.path.join(real, entry), link)
    os.environ["SPARK_HOME"] = home


def main():
    with open(sys.argv[1]) as f:
        settings = json.load(f)
    token = os.environ.get("SHOAL_AGENT_TOKEN", "")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    if settings["master"].startswith("local-cluster["):
        use_spark_home_of_our_own()
    from pyspark import SparkConf, SparkContext

    # Until the stage runs no agent can register: the job is queued from now on, not only once
    # the context is up (its JVM, and on Kubernetes its client, can take longer than the
    # master's registration deadline on a loaded machine).
    emit("queued", reason=f"Spark has not started the barrier stage yet: the application "
                          f"{settings['app_name']} is starting (master {settings['master']})")
    conf = SparkConf().setAppName(settings["app_name"]).setMaster(settings["master"])
    for key, value in settings["conf"].items():
        conf.set(key, value)
    context_up = threading.Event()
    if settings["master"] == "yarn":
        # Queued from the start: the master's deadline for the agents to register must not run
        # while YARN starts the application (tens of seconds), let alone while it waits for room.
        emit("queued", reason=f"Spark is submitting {settings['app_name']} to YARN")
        SparkContext._ensure_initialized(conf=conf)  # the JVM, before the blocking SparkContext
        threading.Thread(target=watch_yarn_admission, args=(settings["app_name"], context_up),
                         daemon=True).start()
    sc = SparkContext(conf=conf)
    context_up.set()
    sc.setLogLevel(settings.get("log_level", "WARN"))
    if settings["ship_binary"]:
        sc.addFile(settings["shoal_binary"])
    emit("application", app_id=sc.applicationId, ui=sc.uiWebUrl or "")

    names = [p["name"] for p in settings["places"]]
    key = secrets.token_hex(16)
    places = Places(names, key)
    driver_host = settings["conf"].get("spark.driver.host", "127.0.0.1")
    server = socket.create_server((driver_host, 0), backlog=len(names) + 8)
    address = (driver_host, server.getsockname()[1])

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=places.serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

    def commands():
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["replace"] and len(words) == 2:
                places.replace(words[1])
            elif words[:1] == ["terminate"] and len(words) == 2:
                places.terminate(words[1])
            elif words[:1] == ["end"]:
                stopping.set()
        stopping.set()  # stdin closed: the backend is gone

    threading.Thread(target=commands, daemon=True).start()

    n = len(names)
    result = {}

    def run_stage():
        sc.setJobGroup("shoal", settings["app_name"], interruptOnCancel=True)
        try:
            rdd = sc.parallelize(range(n), n)
            # The shuffle after the barrier stage makes it a ShuffleMapStage: Spark retries a
            # failed barrier ShuffleMapStage as a whole (spark.stage.maxConsecutiveAttempts),
            # but aborts the job when a barrier ResultStage fails.
            result["rows"] = rdd.barrier().mapPartitionsWithIndex(
                make_place_runner(settings, token, address, key)).repartition(1).collect()
        except Exception as e:  # the job failed: Spark's message is the reason
            text = str(e).strip()
            result["error"] = text.splitlines()[0] if text else repr(e)
            for line in text.splitlines():
                if "SPARK-24819" in line or "Barrier" in line or "aborted" in line:
                    # ": org.apache.spark.SparkException: Job aborted ...": Spark's own words.
                    line = line.strip().lstrip(": ")
                    result["error"] = line.replace("org.apache.spark.SparkException: ", "", 1)
                    break

    stage = threading.Thread(target=run_stage, daemon=True)
    stage.start()
    jvm_sc = sc._jsc.sc()
    last_reason, gang_seen = None, False
    while stage.is_alive() and not stopping.is_set():
        with places.lock:
            gang_seen = gang_seen or len(places.conns) == n
        if not gang_seen:
            executors = max(0, jvm_sc.getExecutorMemoryStatus().size() - 1)
            reason = (f"Spark has not started the barrier stage of {sc.applicationId} yet: it "
                      f"needs {n} task slots at once ({settings['task_resources']} each); "
                      f"{executors} executor{'s' if executors != 1 else ''} registered")
            if reason != last_reason:
                emit("queued", reason=reason)
                last_reason = reason
        stage.join(timeout=0.2)
    if stopping.is_set():
        # End every barrier task (each stops its agent), then whatever has not ended.
        places.end()
        stage.join(timeout=8)
        sc.cancelJobGroup("shoal")
        stage.join(timeout=5)
        emit("finished", ok=False, reason="stopped by Shoal")
    elif "error" in result:
        emit("finished", ok=False, reason=result["error"])
    else:
        emit("finished", ok=True, reason="every agent exited 0")
    server.close()
    sc.stop()


if __name__ == "__main__":
    main()
