"""Entrypoint of the Spark executor image of the Kubernetes test cluster (images.py spark).

Spark's Kubernetes scheduler starts each executor pod with the single argument `executor` and
describes the executor in the pod's environment, leaving it to the image to turn that into the
executor's JVM. This does, with the image's Java and PySpark's jars:

  SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES, SPARK_APPLICATION_ID,
  SPARK_EXECUTOR_POD_IP, SPARK_RESOURCE_PROFILE_ID, SPARK_EXECUTOR_POD_NAME
      the KubernetesExecutorBackend's command line
  SPARK_EXECUTOR_MEMORY   the heap (-Xms and -Xmx)
  SPARK_JAVA_OPT_0, _1, ...  JVM options in their order (spark.executor.extraJavaOptions and
                          the --add-opens Spark needs on Java 17)
  SPARK_CLASSPATH, SPARK_EXTRA_CLASSPATH  put before the jars (spark.executor.extraClassPath)

Any other first argument is run as a command, so the image also serves `kubectl run ... --
python3 -c ...`. Runs under the image's python3, which the executor needs anyway.
"""

import os
import re
import sys

EXECUTOR_CLASS = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
# Each variable the executor cannot start without, and the flag that carries it.
REQUIRED = [("SPARK_DRIVER_URL", "--driver-url"), ("SPARK_EXECUTOR_ID", "--executor-id"),
            ("SPARK_EXECUTOR_CORES", "--cores"), ("SPARK_APPLICATION_ID", "--app-id"),
            ("SPARK_EXECUTOR_POD_IP", "--hostname")]


def java_options(env):
    numbered = []
    for name, value in env.items():
        match = re.fullmatch(r"SPARK_JAVA_OPT_(\d+)", name)
        if match:
            numbered.append((int(match.group(1)), value))
    return [value for _, value in sorted(numbered)]


def executor_command(env):
    missing = [name for name, _ in REQUIRED if not env.get(name)]
    if missing:
        sys.exit(f"spark executor entrypoint: the pod's environment lacks {', '.join(missing)} "
                 f"(Spark's Kubernetes scheduler sets them)")
    java = os.path.join(env["JAVA_HOME"], "bin", "java")
    classpath = [env[name] for name in ("SPARK_CLASSPATH", "SPARK_EXTRA_CLASSPATH")
                 if env.get(name)]
    classpath.append(os.path.join(env["SPARK_HOME"], "jars", "*"))
    argv = [java] + java_options(env)
    if env.get("SPARK_EXECUTOR_MEMORY"):
        argv += ["-Xms" + env["SPARK_EXECUTOR_MEMORY"], "-Xmx" + env["SPARK_EXECUTOR_MEMORY"]]
    argv += ["-cp", ":".join(classpath), EXECUTOR_CLASS]
    for name, flag in REQUIRED:
        argv += [flag, env[name]]
    argv += ["--resourceProfileId", env.get("SPARK_RESOURCE_PROFILE_ID", "0")]
    if env.get("SPARK_EXECUTOR_POD_NAME"):
        argv += ["--podName", env["SPARK_EXECUTOR_POD_NAME"]]
    return argv


def main(argv):
    if not argv:
        sys.exit("spark executor entrypoint: give `executor` or a command to run")
    command = executor_command(os.environ) if argv[0] == "executor" else argv
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.exit(f"spark executor entrypoint: cannot run {command[0]}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
