#!/usr/bin/env bash
# Runs one task of an `srun` step with meshfeed's UCX rendezvous environment, from
# Slurm's: RANK and WORLD_SIZE from the task's, MASTER_ADDR the step's first node (its
# address as Slurm knows it), MASTER_PORT derived from the job id, and the job's token
# (MESHFEED_JOB_TOKEN, which the submitter exports; never derived from public values).
#
#   MESHFEED_JOB_TOKEN=$(openssl rand -hex 16) srun --mpi=none slurm/ucx_task.sh meshfeed run --transport ucx ...
set -euo pipefail
: "${MESHFEED_JOB_TOKEN:?export MESHFEED_JOB_TOKEN (a secret shared by the tasks of the job) before srun}"
export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
MASTER_ADDR=$(scontrol show node "$first" -o | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export MASTER_ADDR=${MASTER_ADDR:-$first}
export MASTER_PORT=${MESHFEED_MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
export MESHFEED_JOB_ID=slurm-$SLURM_JOB_ID.${SLURM_STEP_ID:-0}
exec "$@"
