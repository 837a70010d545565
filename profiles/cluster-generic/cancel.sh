#!/usr/bin/env bash
# Cancel command of profiles/cluster-generic: `cancel.sh JOBID...` stops the jobs that submit.sh
# started, each with its whole process group (the job's snakemake and the rule it runs).
dir="${ANETTS_CLUSTER_DIR:-.snakemake/cluster-generic}"
for id in "$@"; do
    pid="$(cat "$dir/$id.pid" 2> /dev/null)" && kill -TERM -- "-$pid" 2> /dev/null
done
exit 0
