#!/usr/bin/env bash
# Submit command of profiles/cluster-generic: "submits" one Snakemake jobscript by starting it as
# its own background process on this machine, and prints a job id. Snakemake calls it as
# `submit.sh JOBSCRIPT` from the working directory. A site's sbatch/qsub wrapper takes its place.
#
# Per job, in $ANETTS_CLUSTER_DIR (default .snakemake/cluster-generic): <id>.pid (the process,
# which is also its process group), <id>.log (the job's output), and <id>.rc (its exit code,
# written when it ends). status.sh and cancel.sh read them.
set -euo pipefail
jobscript="$1"
dir="${ANETTS_CLUSTER_DIR:-.snakemake/cluster-generic}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
job="$(mktemp "$dir/job.XXXXXXXX")"
# setsid: a session of its own, so the job outlives this script and leaves with none of
# snakemake's signals; the exit code goes through a temporary name so it is never read half-written
setsid bash -c 'bash "$1" > "$2.log" 2>&1; echo $? > "$2.rc.tmp"; mv "$2.rc.tmp" "$2.rc"' \
    job "$jobscript" "$job" < /dev/null > /dev/null 2>&1 &
echo $! > "$job.pid"
basename "$job"
