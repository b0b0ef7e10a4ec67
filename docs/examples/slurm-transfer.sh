#!/usr/bin/env bash
# Fire-and-forget transfer from a batch job (Slurm; PBS users swap the #SBATCH lines for #PBS).
# The job hands the copy to the site's tern service and waits for it; the batch job's exit
# status is the transfer's: 0 succeeded, 1 failed, 3 canceled, 4 timed out, 2 usage/API error.
# No human re-authenticates: TERN_TOKEN is a long-lived, path-limited transfer token, e.g.
#   tern token create --scope transfer --expires 180d --name nightly --path /scratch/$USER
#
#SBATCH --job-name=tern-transfer
#SBATCH --time=12:00:00
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=256M
#SBATCH --output=tern-transfer-%j.out
#PBS -N tern-transfer
#PBS -l walltime=12:00:00
set -euo pipefail

: "${TERN_SERVER:?set TERN_SERVER, e.g. https://dtn1.example.org:7443}"
: "${TERN_TOKEN:?set TERN_TOKEN (or TERN_TOKEN=@FILE) to a transfer-scope token}"
# TERN_CA_FILE: the service's certificate, when it is self-signed.
SRC=${SRC:-/scratch/$USER/run42}
DST=${DST:-tern://archive.example.org:7700/projects/run42}
TERN=${TERN:-tern}

# The service runs the copy: a node failure or a requeue of this batch job does not stop it,
# and `tern wait` rides over a restart of the service. --notify mails the outcome as well.
id=$("$TERN" submit "$SRC" "$DST" --label "${SLURM_JOB_ID:-${PBS_JOBID:-manual}}" ${NOTIFY:+--notify "$NOTIFY"}) &&
  "$TERN" wait "$id" --timeout "${WAIT_TIMEOUT:-43000}"
