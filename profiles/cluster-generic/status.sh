#!/usr/bin/env bash
# Status command of profiles/cluster-generic: `status.sh JOBID` prints running, success or failed
# for a job that submit.sh started (see there for the files it reads).
set -uo pipefail
job="${ANETTS_CLUSTER_DIR:-.snakemake/cluster-generic}/$1"
if [[ -f "$job.rc" ]]; then
    [[ "$(cat "$job.rc")" == 0 ]] && echo success || echo failed
elif kill -0 "$(cat "$job.pid")" 2> /dev/null; then
    echo running
elif [[ -f "$job.rc" ]]; then  # it ended between the two checks
    [[ "$(cat "$job.rc")" == 0 ]] && echo success || echo failed
else  # gone without an exit code: killed
    echo failed
fi
