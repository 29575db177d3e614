#!/usr/bin/env python3
"""Elastic membership: after a worker of an elastic role is killed, how long until every member
of the new generation has started with a consistent world; and, over every fault, no hang, no
orphan process, and a restart limit that is never bypassed.

The job: framework pytorch (so RANK and WORLD_SIZE are set), on_failure: elastic, role
`worker` with instances {min: 2, max: 4}, max_restarts 1000000, backoff {initial: B, max: B}
(--slot-backoff-ms, 200 ms: how long a killed worker's slot stays out before the group grows
back). Each worker is /bin/sh: it writes its pid, RANK, WORLD_SIZE, SHOAL_GENERATION,
SHOAL_INDEX and the time (date +%s%N) to a file, then execs `sleep`.

Each fault (--faults, 200) starts from a settled job (the latest generation has all 4 members
started and no restart is pending), SIGKILLs a random member and measures kill -> the last
member of the first new generation wrote its file. The generation must be consistent: its
members' RANKs are exactly 0..n-1, all saw WORLD_SIZE = n, n matches the journal's
rendezvous record, and 2 <= n <= 4. With probability --second-kill (0.2) a member of the
shrunk world (3) is killed too as soon as it is up (3 -> 2), and then with probability
--third-kill (0.5) one of the 2 (below min: Shoal restarts the whole group after the backoff
instead of shrinking); those faults are measured the same way and reported by the world size
they hit. Then the job must grow back to 4 (measured from the capacity-back group restart to
all members started) and settle within --bound seconds (10), else the fault counts as a hang.
Once settled, /proc is scanned: every process carrying the job's SHOAL_JOB_ID must be a member
of the current generation; any other is an orphan.

Restart limit (separate short jobs, --limit K, 3): under elastic, restart-group and
restart-task with max_restarts K, a worker (for restart-task always the same one) is killed
each time the job has settled; the job must survive exactly K kills and fail on kill K+1.

Prints one JSON object on stdout. Target: p99 < 500 ms. There is no measured anchor:
torchrun's elastic agent re-forms worlds over nodes, not over processes of one node; the
documented figures for lost-node detection are quoted as constants.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

TARGET_MS = 500.0
MIN, MAX = 2, 4

WORKER_SH = ('f="$OUT/m-g${SHOAL_GENERATION}-i${SHOAL_INDEX}-$$"; '
             'echo "$$ ${RANK} ${WORLD_SIZE} ${SHOAL_GENERATION} ${SHOAL_INDEX} $(date +%s%N)" '
             '> "$OUT/.t$$" && mv "$OUT/.t$$" "$f"; exec sleep 1000000')


def job_yaml(name, policy, max_restarts, backoff_ms, out_dir):
    inst = f"{{min: {MIN}, max: {MAX}}}" if policy == "elastic" else str(MAX)
    return (f"name: {name}\n"
            "framework: pytorch\n"
            f"on_failure: {policy}\n"
            f"max_restarts: {max_restarts}\n"
            f"backoff: {{initial: {backoff_ms}ms, max: {backoff_ms}ms}}\n"
            "roles:\n"
            "  worker:\n"
            f"    instances: {inst}\n"
            f"    command: {json.dumps(['/bin/sh', '-c', WORKER_SH])}\n"
            f"    env: {{OUT: {json.dumps(str(out_dir))}}}\n"
            "    resources: {cpus: 0.01}\n")


def read_members(out_dir, gen):
    """{index: {pid, rank, world, gen, index, t_us}} of generation gen."""
    found = {}
    for p in Path(out_dir).glob(f"m-g{gen}-i*-*"):
        try:
            pid, rank, world, g, index, t_ns = p.read_text().split()
            found[int(index)] = {"pid": int(pid), "rank": int(rank), "world": int(world),
                                 "gen": int(g), "index": int(index), "t_us": int(t_ns) / 1000.0}
        except (OSError, ValueError):
            pass
    return found


class Tracker:
    """Follows a job's generations through its journal and the members' files."""

    def __init__(self, job, out_dir):
        self.job, self.out = job, out_dir
        self.last_restarted_index = 0

    def latest_restarted(self, start=0):
        """(index, generation, world_size) of the last group_restarted record (or the first
        rendezvous, generation 0) at index >= start."""
        self.job.journal.poll()
        best = None
        for i in range(start, len(self.job.journal.records)):
            r = self.job.journal.records[i]
            if r.get("type") == "group_restarted" or (
                    r.get("type") == "rendezvous" and r.get("generation") == 0):
                best = (i, r.get("generation", 0), r.get("world_size"))
        return best

    def rendezvous(self, gen):
        for r in self.job.journal.records:
            if r.get("type") == "rendezvous" and r.get("generation") == gen:
                return r
        return None

    def wait_generation_after(self, mark, gen_before, deadline):
        """Waits for the first generation after gen_before (a group_restarted record at index
        >= mark) whose members have all started. A generation superseded by a newer
        group_restarted before all its members started is skipped. Returns (gen, world,
        members, rdzv, skipped) or None."""
        start, skipped = mark, 0
        while True:
            idx, rec = self.job.journal.wait_for(
                lambda r: r.get("type") == "group_restarted" and r.get("generation", 0) > gen_before,
                max(0.0, deadline - time.monotonic()), start=start)
            if rec is None:
                return None
            self.last_restarted_index = idx
            gen, world = rec["generation"], rec["world_size"]
            while True:
                members = read_members(self.out, gen)
                if len(members) >= world:
                    return gen, world, members, self.rendezvous(gen), skipped
                if self.job.finished() or time.monotonic() > deadline:
                    return None
                self.job.journal.poll()
                if any(r.get("type") == "group_restarted"
                       for r in self.job.journal.records[idx + 1:]):
                    skipped += 1
                    gen_before, start = gen, idx + 1
                    break
                time.sleep(0.002)

    def settled(self):
        """(gen, members) when the latest generation has MAX members started and no group
        restart begun after it; else None."""
        last = self.latest_restarted()
        if last is None:
            return None
        idx, gen, world = last
        if world != MAX:
            return None
        if any(r.get("type") == "group_restart_begun" for r in self.job.journal.records[idx:]):
            return None
        members = read_members(self.out, gen)
        if len(members) < world:
            return None
        return gen, members

    def wait_settled(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.settled()
            if s:
                return s
            if self.job.finished():
                return None
            time.sleep(0.005)
        return None


def check_world(world, members, rdzv, killed=None, below_min=False):
    """Problems with a generation's membership, as strings. killed: the slot just killed, which
    must be out of a shrunk world (its backoff is running) and in a world re-formed because the
    group fell below min."""
    problems = []
    ranks = sorted(m["rank"] for m in members.values())
    if ranks != list(range(world)):
        problems.append(f"ranks {ranks} are not 0..{world - 1}")
    sizes = {m["world"] for m in members.values()}
    if sizes != {world}:
        problems.append(f"WORLD_SIZE seen {sorted(sizes)}, expected {world}")
    if not MIN <= world <= MAX:
        problems.append(f"world {world} outside [{MIN}, {MAX}]")
    if rdzv is None:
        problems.append("no rendezvous record")
    else:
        if rdzv.get("world_size") != world:
            problems.append(f"rendezvous world_size {rdzv.get('world_size')} != {world}")
        want = {int(x["task"].split(":")[1]): x["rank"] for x in rdzv.get("ranks", [])}
        got = {i: m["rank"] for i, m in members.items()}
        if want != got:
            problems.append(f"ranks by index {got} differ from the rendezvous {want}")
    if killed is not None:
        if below_min and killed not in members:
            problems.append(f"killed slot {killed} left out although the world fell below min")
        if not below_min and killed in members:
            problems.append(f"killed slot {killed} is back before its backoff")
    return problems


def orphans(job_id, gen, members):
    pids = {m["pid"] for m in members.values()}
    found = []
    for pid, env in c.job_task_processes(job_id).items():
        if env.get("SHOAL_GENERATION") != str(gen) or pid not in pids:
            found.append({"pid": pid, "generation": env.get("SHOAL_GENERATION"),
                          "index": env.get("SHOAL_INDEX"),
                          "cmd": " ".join(c.proc_cmdline(pid) or [])[:80]})
    return found


def run_main(args, shoal, tmp, rng):
    out = tmp / "members"
    out.mkdir()
    job_file = tmp / "elastic.yaml"
    job_file.write_text(job_yaml("em-elastic", "elastic", 1000000, args.slot_backoff_ms, out))
    job = c.ShoalJob(shoal, tmp / "jobs-elastic", job_file)
    tr = Tracker(job, out)
    lat = {4: [], 3: [], 2: []}
    growth = []
    problems, hangs, orphan_list = [], [], []
    n_faults = done = superseded = 0
    worlds = {}
    t_begin = time.monotonic()
    res = {"faults_requested": args.faults, "instances": {"min": MIN, "max": MAX},
           "slot_backoff_ms": args.slot_backoff_ms, "bound_s": args.bound,
           "second_kill_probability": args.second_kill,
           "third_kill_probability": args.third_kill}
    try:
        err = job.start()
        if err:
            res["error"] = err
            return res
        s = tr.wait_settled(60)
        if s is None:
            res["error"] = "the job did not start all 4 workers within 60 s"
            return res
        gen, members = s
        for i in range(args.faults):
            world_now = len(members)
            hung = False
            while True:
                victim = rng.choice(sorted(members))
                job.journal.poll()
                mark = len(job.journal.records)
                if not c.proc_alive(members[victim]["pid"]):
                    break  # superseded meanwhile (a restart to grow back): nothing to kill
                t0 = c.now_us()
                c.kill_quietly(members[victim]["pid"])
                n_faults += 1
                deadline = time.monotonic() + args.bound
                got = tr.wait_generation_after(mark, gen, deadline)
                if got is None:
                    hangs.append({"fault": i, "world": world_now,
                                  "journal_tail": job.journal.records[-12:]})
                    hung = True
                    break
                new_gen, world, new_members, rdzv, skipped = got
                superseded += skipped
                worlds[world] = worlds.get(world, 0) + 1
                bad = check_world(world, new_members, rdzv,
                                  killed=None if skipped else victim,
                                  below_min=world_now - 1 < MIN)
                if bad:
                    problems.append({"fault": i, "generation": new_gen, "killed_in": world_now,
                                     "problems": bad})
                lat[world_now].append(
                    (max(m["t_us"] for m in new_members.values()) - t0) / 1000.0)
                gen, members = new_gen, new_members
                # Kill again into a shrunk world (4 -> 3 -> 2 -> below min), only while it is
                # still the latest generation (a restart to grow back may be under way).
                if world_now <= MIN or world >= world_now:
                    break
                last = tr.latest_restarted()
                p = args.second_kill if world == 3 else args.third_kill
                if last is None or last[1] != gen or rng.random() >= p:
                    break
                world_now = world
            if hung:
                break
            # Grow back: every restart begun for capacity, then settle at MAX.
            s = tr.wait_settled(args.bound)
            if s is None:
                hangs.append({"fault": i, "stage": "grow back to 4 and settle",
                              "journal_tail": job.journal.records[-8:]})
                break
            gen, members = s
            # The restart that grows the world back: the one begun after the last shrink.
            grow = [r for r in job.journal.records[tr.last_restarted_index:]
                    if r.get("type") == "group_restart_begun"]
            if grow:
                t_g = c.record_us(grow[0])
                growth.append((max(m["t_us"] for m in members.values()) - t_g) / 1000.0)
            bad = check_world(MAX, members, tr.rendezvous(gen))
            if bad:
                problems.append({"fault": i, "generation": gen, "problems": bad})
            o = orphans(job.job_id, gen, members)
            if o:
                orphan_list.append({"fault": i, "generation": gen, "processes": o})
            done = i + 1
            if (i + 1) % 25 == 0:
                allv = lat[4] + lat[3] + lat[2]
                c.log(f"  elastic: {i + 1}/{args.faults} faults ({n_faults} kills), median "
                      f"{c.median(allv):.1f} ms, generation {gen}")
    finally:
        left = job.stop()
    allv = lat[4] + lat[3] + lat[2]
    res.update({
        "faults": done, "kills": n_faults,
        "seconds": round(time.monotonic() - t_begin, 1),
        "kill_to_consistent_world": c.summary_ms(allv),
        "by_world_killed_in": {"4 (shrinks to 3)": c.summary_ms(lat[4]),
                               "3 (shrinks to 2)": c.summary_ms(lat[3]),
                               "2 (below min: whole group restarts after the backoff)":
                                   c.summary_ms(lat[2])},
        "capacity_back_to_world_of_4": c.summary_ms(growth),
        "generations_superseded_before_all_started": superseded,
        "new_world_sizes": {str(k): v for k, v in sorted(worlds.items())},
        "inconsistent_generations": problems,
        "hangs": hangs,
        "orphans": orphan_list,
        "leftover_after_stop": left,
        "target": f"kill_to_consistent_world p99 < {TARGET_MS:g} ms",
        "target_met": None if not allv else c.p99(allv) < TARGET_MS,
        "checks_passed": not problems and not hangs and not orphan_list,
    })
    return res


def run_limit(args, shoal, tmp, rng, policy):
    """A job with max_restarts K: kill at each settle; it must survive K kills and fail on
    the next."""
    k = args.limit
    out = tmp / f"limit-{policy}"
    out.mkdir()
    job_file = tmp / f"limit-{policy}.yaml"
    job_file.write_text(job_yaml(f"em-limit-{policy}", policy, k, args.slot_backoff_ms, out))
    job = c.ShoalJob(shoal, tmp / f"jobs-limit-{policy}", job_file)
    res = {"max_restarts": k}
    try:
        err = job.start()
        if err:
            return {"error": err}
        kills = 0
        failed_on = None
        while kills <= k + 2:
            deadline = time.monotonic() + args.bound
            pids = None
            while time.monotonic() < deadline:
                tasks = job.tasks() or {}
                if job.finished():
                    break
                run = {n: t for n, t in tasks.items() if t["state"] == "running" and t["pid"]}
                if tasks and all(t["state"] == "running" for t in tasks.values()
                                 if t["in_world"]) and len(run) == MAX:
                    # Settled: also every member wrote its file (its process is up).
                    if all(c.proc_alive(t["pid"]) for t in run.values()):
                        pids = run
                        break
                time.sleep(0.02)
            if job.finished() or pids is None:
                break
            victim = "worker:0" if policy == "restart-task" else rng.choice(sorted(pids))
            c.kill_quietly(pids[victim]["pid"])
            kills += 1
            # Either the job fails, or the victim is replaced.
            t_end = time.monotonic() + args.bound
            while time.monotonic() < t_end:
                if job.finished():
                    failed_on = kills
                    break
                t = (job.tasks() or {}).get(victim)
                if t and t["pid"] != pids[victim]["pid"] and t["state"] == "running":
                    break
                if t and not t["in_world"]:
                    break
                time.sleep(0.02)
            if failed_on:
                break
        fin = job.wait_finished(args.bound)
        res.update({
            "kills": kills,
            "job_failed_on_kill": failed_on,
            "outcome": None if fin is None else fin.get("outcome"),
            "reason": None if fin is None else fin.get("reason"),
            "expected": f"survives {k} kills, fails on kill {k + 1}",
            "ok": failed_on == k + 1 and fin is not None and fin.get("outcome") == "failed",
        })
    finally:
        time.sleep(0.2)
        left_procs = c.job_task_processes(job.job_id) if job.job_id else {}
        res["task_processes_left_after_failure"] = sorted(left_procs)
        res["leftover_after_stop"] = job.stop()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--faults", type=int, default=200, help="faults (200)")
    ap.add_argument("--slot-backoff-ms", type=int, default=200,
                    help="backoff initial = max: how long a killed slot stays out (200)")
    ap.add_argument("--second-kill", type=float, default=0.2,
                    help="probability of killing again in a world of 3 (0.2)")
    ap.add_argument("--third-kill", type=float, default=0.5,
                    help="probability of killing again in a world of 2 (0.5)")
    ap.add_argument("--bound", type=float, default=10.0,
                    help="seconds within which a fault must recover (10)")
    ap.add_argument("--limit", type=int, default=3, help="max_restarts of the limit runs (3)")
    ap.add_argument("--no-limit-check", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {"benchmark": "elastic_membership", "shoal": shoal, "machine": c.machine_info(),
              "seed": args.seed, "documented_anchors": c.DOCUMENTED_ANCHORS}
    if shoal_err:
        result["shoal_error"] = shoal_err
        c.emit(result)
        return 0
    t_all = time.monotonic()
    with c.temp_dir("shoal-bench-em-", keep=args.keep) as tmp:
        c.log(f"elastic_membership: {args.faults} faults")
        result["elastic"] = run_main(args, shoal, tmp, rng)
        if not args.no_limit_check:
            result["restart_limit"] = {}
            for policy in ("elastic", "restart-group", "restart-task"):
                c.log(f"elastic_membership: restart limit, {policy}, max_restarts {args.limit}")
                result["restart_limit"][policy] = run_limit(args, shoal, tmp, rng, policy)
            result["restart_limit_ok"] = all(
                r.get("ok") for r in result["restart_limit"].values())
    result["seconds"] = round(time.monotonic() - t_all, 1)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
