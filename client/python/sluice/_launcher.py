"""What the launcher says about this run: which restart of it this process
belongs to, and the default scope of Once and Barrier names.

    torchrun   TORCHELASTIC_RUN_ID (the rendezvous id) and MASTER_ADDR:MASTER_PORT
               (chosen afresh for every rendezvous round by the c10d and etcd
               backends; an elastic run that grows restarts its workers
               without counting a restart), with TORCHELASTIC_RESTART_COUNT
               on a single node (every agent counts its own restarts, and an
               agent that joins later starts at 0)
    SLURM      SLURM_JOB_ID, SLURM_RESTART_COUNT (a requeued job keeps its id)
    mpirun     Open MPI's job id (OMPI_MCA_ess_base_jobid, or PMIX_NAMESPACE),
               new for every mpirun

A restart id is what every process of one restart shares; the launch id
(new_launch_id) is what tells two launches apart when the launcher gives the
same restart id twice (a torchrun relaunched by hand with a fixed
--rdzv_id, a SLURM job whose restart count is not exported).
"""
import os
import uuid


def restart_id(env=None):
    """The launcher's name for this restart of the run, or "" outside a
    launcher that names one."""
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_RUN_ID"):
        single_node = env.get("LOCAL_WORLD_SIZE", "1") == env.get("WORLD_SIZE", "1")
        count = env.get("TORCHELASTIC_RESTART_COUNT", "0") if single_node else "nodes"
        return (f"torchrun-{env['TORCHELASTIC_RUN_ID']}-{env.get('MASTER_ADDR', '')}:"
                f"{env.get('MASTER_PORT', '')}-{count}")
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}-{env.get('SLURM_RESTART_COUNT', '0')}"
    job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE")
    if job:
        return f"mpi-{job}"
    return ""


def default_scope(env=None):
    """The scope of Once/Barrier names when none is given: $SLUICE_SCOPE, else
    the launcher's restart id, else "default" (shared by every run)."""
    env = os.environ if env is None else env
    return env.get("SLUICE_SCOPE") or restart_id(env) or "default"


def new_launch_id():
    """A fresh id for one launch (one restore of a checkpoint)."""
    return uuid.uuid4().hex
