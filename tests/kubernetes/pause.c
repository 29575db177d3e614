/* The pod sandbox's process for the Kubernetes test cluster (tests/kubernetes/cluster.sh):
 * it holds the pod's namespaces open, reaps orphans, and exits on SIGTERM or SIGINT.
 * Built static, so its image holds this one file. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void Stop(int signal_number) {
  (void)signal_number;
  _exit(0);
}

static void Reap(int signal_number) {
  (void)signal_number;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGINT, Stop);
  signal(SIGTERM, Stop);
  signal(SIGCHLD, Reap);
  for (;;) pause();
}
